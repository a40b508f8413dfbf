"""Profile a real engine's step times into a ``dualpath.spec.engine_profile.EngineProfile``.

``profile_engine`` builds the engines a cluster's workers drive (a ``PrefillEngine`` and a
``DecodeEngine`` over an in-process transport, a block store in a scratch directory, one torch
thread as every engine process runs) and times, as CPU seconds of the engine's thread
(``time.thread_time``: what the step costs on an otherwise idle core, which wall time on a shared
machine would not give; a step's compute runs on that one torch thread, the PE's next-layer load
overlapped on its loader thread):

- ``PrefillEngine.step`` of one request of ``new_len`` tokens on ``cached_len`` cached ones, the
  cached prefix read from the store into the PE buffer beforehand (the PE read path: a step copies
  each layer's cached KV into staging and streams the layer's KV to the DE buffer), on the grid
  ``cached_lens`` x ``new_lens``; a batch of ``REQUEST_BATCH`` equal requests, for what each
  request beyond a step's first adds to it; and a few multi-request batches (``BATCH_CHECKS``) that
  check the profile's batch rule;
- ``DecodeEngine.step`` of ``batch`` requests of ``context_len`` tokens (grid ``batches`` x
  ``contexts``; the fastest of ``DECODE_STEPS`` steps after one warm-up);
- ``DecodeEngine.add_request`` of a finished prefill (its DE buffer -> paged cache copy and the
  persists it queues) per prompt length in ``JOIN_LENS``;

and the whole-forward attention line the PE's compute quota batches with
(``profile.attention_predictor``, as a PE measures at start). Each prefill and join point is the
minimum over ``repeats`` runs; the engines are warmed up once before.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from itertools import count

import torch

from dualpath.core.errors import require
from dualpath.policy.views import BatchEntry
from dualpath.runtime.cluster.api import SamplingParams
from dualpath.runtime.engine.decode import DecodeConfig, DecodeEngine
from dualpath.runtime.engine.prefill import PrefillConfig, PrefillEngine
from dualpath.runtime.engine.profile import attention_predictor
from dualpath.runtime.engine.types import KVGeometry, PrefillRequest
from dualpath.runtime.kvstore import BlockStore, IOEngine, IOEngineConfig
from dualpath.runtime.model import Decoder
from dualpath.runtime.transfer import InProcFabric
from dualpath.spec.engine_profile import BatchPoint, DecodePoint, EngineProfile, JoinPoint, PrefillPoint

CACHED_LENS = (0, 256, 1024)
NEW_LENS = (1, 16, 64, 256, 512, 1024)
BATCHES = (1, 2, 4, 8)
CONTEXTS = (64, 512, 1024, 2048)
JOIN_LENS = (64, 512, 1024, 2048)
BATCH_CHECKS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, 300), (0, 400)),
    ((0, 236), (0, 298), (0, 361)),
    ((320, 17), (640, 63), (384, 7), (448, 4)),
)
DECODE_STEPS = 5
# the batch that measures what each request beyond a step's first costs (its grid points: (0, 16),
# (256, 16) and (0, 64) must be on the grid)
REQUEST_SPAN, REQUEST_BATCH = (256, 16), 4
# long enough for the decode points (the DE allocates prompt + max_tokens of cache at admission)
GREEDY = SamplingParams(max_tokens=DECODE_STEPS + 2, ignore_eos=True)


def load_for_profile(model: str) -> tuple[Decoder, str]:
    """The decoder an engine process of ``ClusterConfig(model=model)`` runs (fp32, CPU): a model
    name or path, or "tiny" (the cluster's small random model, made as ``LocalCluster`` makes it);
    and the name to record."""
    from pathlib import Path

    from dualpath.runtime.cluster.local import tiny_model_dir
    from dualpath.runtime.model import load_decoder

    if model != "tiny":
        return load_decoder(model, device="cpu", dtype=torch.float32)[0], model
    with tempfile.TemporaryDirectory(prefix="dualpath-profile-tiny-") as root:
        return load_decoder(str(tiny_model_dir(Path(root))), device="cpu", dtype=torch.float32)[0], model


def profile_engine(
    decoder: Decoder,
    *,
    model: str,
    block_size: int = 64,
    cached_lens: Sequence[int] = CACHED_LENS,
    new_lens: Sequence[int] = NEW_LENS,
    batches: Sequence[int] = BATCHES,
    contexts: Sequence[int] = CONTEXTS,
    join_lens: Sequence[int] = JOIN_LENS,
    batch_checks: Sequence[Sequence[tuple[int, int]]] = BATCH_CHECKS,
    repeats: int = 2,
    progress: Callable[[str], None] | None = None,
) -> EngineProfile:
    """Time ``decoder``'s engines (module docstring); ``model`` names it in the profile."""
    require(repeats >= 1, "repeats", repeats, "must be >= 1")
    for lens, name in ((cached_lens, "cached_lens"), (contexts, "contexts"), (join_lens, "join_lens")):
        require(all(n % block_size == 0 for n in lens), name, lens, f"multiples of {block_size}")
    say = progress or (lambda _m: None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with _Rig(
            decoder, block_size, max(max(cached_lens) + max(new_lens), max(contexts) + 1, max(join_lens) + 1)
        ) as rig:
            say("attention line (the compute quota's predictor)")
            line = attention_predictor(decoder)
            prefill = rig.prefill_grid(cached_lens, new_lens, repeats, say)
            request_s = rig.request_s(prefill, repeats)
            checks = [BatchPoint(entries=tuple(b), seconds=rig.prefill_min(b, repeats)) for b in batch_checks]
            say("decode steps")
            decode = [rig.decode_point(b, c) for b in batches for c in contexts]
            joins = [JoinPoint(prompt_len=n, seconds=rig.join_min(n, repeats)) for n in join_lens]
    finally:
        torch.set_num_threads(threads)
    cfg = decoder.config
    return EngineProfile(
        model=model,
        dtype=str(decoder.dtype).removeprefix("torch."),
        num_layers=decoder.num_layers,
        num_heads=cfg.num_heads,
        head_dim=cfg.head_dim,
        kv_bytes_per_token=rig.geometry.layout.kv_bytes_per_token,
        block_size=block_size,
        torch_threads=1,
        clock="thread_cpu",
        cpu_cores=os.cpu_count() or 1,
        host=f"{platform.node()} ({platform.processor() or platform.machine()})",
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        max_context_len=cfg.max_position_embeddings,  # sizes the PE staging floor (spec/kv_pools.py)
        attention_s_per_gflop=line.seconds_per_gflop,
        attention_intercept_s=line.intercept_s,
        prefill_request_s=request_s,
        prefill=tuple(prefill),
        decode=tuple(decode),
        join=tuple(joins),
        batches=tuple(checks),
    )


class _Rig:
    """One PE and one DE over an in-process transport, a store holding the KV of one fixed token
    sequence (so any block-aligned prefix of it is a hit)."""

    def __init__(self, decoder: Decoder, block_size: int, max_len: int) -> None:
        self.decoder = decoder
        self.geometry = geo = KVGeometry.of(decoder.config, decoder.dtype, block_size)
        self.block_size = block_size
        self._dir = tempfile.TemporaryDirectory(prefix="dualpath-profile-")
        self.store = BlockStore(self._dir.name, geo.layout, None)
        self.io = IOEngine(self.store, IOEngineConfig(queue_depth=4))
        self.transport = InProcFabric().transport(asynchronous=False)
        blocks = -(-max_len // block_size) + 1
        bbytes = geo.layout.full_block_bytes
        self.pe = PrefillEngine(decoder, self.transport, self.io, PrefillConfig(
            name="pe0", block_size=block_size, buffer_bytes=4 * blocks * bbytes,
            max_cached_tokens=4 * blocks * block_size, overlap=True))  # fmt: skip
        self.de = DecodeEngine(decoder, self.transport, self.io, DecodeConfig(
            name="de0", block_size=block_size, buffer_bytes=4 * blocks * bbytes,
            num_cache_blocks=max(BATCHES) * blocks + 8))  # fmt: skip
        self.pe.connect("de0", self.de)
        gen = torch.Generator().manual_seed(0)
        vocab = decoder.config.vocab_size
        self.tokens = tuple(int(t) for t in torch.randint(1, vocab, (max_len,), generator=gen))
        self._ids = count()
        self._persist_base()  # (also warms the engines up: every later step is timed)
        self.prefill_min([(0, block_size)], 1)

    def __enter__(self) -> _Rig:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pe.close()
        self.io.close()
        self.transport.close()
        self._dir.cleanup()

    def _persist_base(self) -> None:
        """Prefill the whole sequence (in chunks) and admit it on the DE, which persists its full
        blocks; wait until the store holds them."""
        rid, ids = self._admit(len(self.tokens) - 1, 0)
        done = 0
        while done < len(ids):
            n = min(1024, len(ids) - done)
            outs = self.pe.step([BatchEntry(request_id=rid, cached_len=done, chunk_len=n)])
            done += n
        assert self.de.add_request(rid, ids, outs[0].first_token, GREEDY)
        want = len(ids) // self.block_size
        deadline = time.monotonic() + 120.0
        while len(self.store.match_prefix(ids)) < want:
            require(time.monotonic() < deadline, "store", self._dir.name, "did not persist the base blocks")
            time.sleep(0.05)
        self.de.abort(rid)

    def _admit(self, length: int, cached_len: int) -> tuple[str, tuple[int, ...]]:
        """A request for the sequence's first ``length`` tokens whose first ``cached_len`` are read
        from the store on the PE path; returns once its reads are in the PE buffer."""
        rid = f"p{next(self._ids)}"
        ids = self.tokens[:length]
        hits = tuple(self.store.match_prefix(ids))[: cached_len // self.block_size] if cached_len else ()
        assert len(hits) * self.block_size == cached_len, (cached_len, len(hits))
        assert self.de.reserve(rid, len(ids))
        req = PrefillRequest(request_id=rid, token_ids=ids, decode_endpoint="de0", read_side="pe",
                             hit_hashes=hits, sampling=GREEDY)  # fmt: skip
        assert self.pe.add_request(req)
        while not any(w.request_id == rid for w in self.pe.waiting()):
            time.sleep(0.001)
        return rid, ids

    def _timed_step(
        self, spans: Sequence[tuple[int, int]]
    ) -> tuple[float, list[tuple[str, tuple[int, ...], int]]]:
        """One PE step over fresh requests of ``(cached_len, new_len)``; (seconds, finished)."""
        admitted = [(*self._admit(c + n, c), c, n) for c, n in spans]
        entries = [BatchEntry(request_id=rid, cached_len=c, chunk_len=n) for rid, _ids, c, n in admitted]
        t0 = time.thread_time()
        outs = self.pe.step(entries)
        seconds = time.thread_time() - t0
        first = {o.request_id: o.first_token for o in outs}
        return seconds, [(rid, ids, first[rid]) for rid, ids, _c, _n in admitted]

    def prefill_min(self, spans: Sequence[tuple[int, int]], repeats: int) -> float:
        best = float("inf")
        for _ in range(repeats):
            seconds, done = self._timed_step(spans)
            for rid, _ids, _tok in done:
                self.de.abort(rid)
            best = min(best, seconds)
        return best

    def prefill_grid(
        self, cached: Sequence[int], new: Sequence[int], repeats: int, say: Callable[[str], None]
    ) -> list[PrefillPoint]:
        out = []
        for c in cached:
            say(f"prefill steps on {c} cached tokens")
            out += [
                PrefillPoint(cached_len=c, new_len=n, seconds=self.prefill_min([(c, n)], repeats))
                for n in new
            ]
        return out

    def request_s(self, grid: list[PrefillPoint], repeats: int) -> float:
        """What each request beyond a step's first adds to it: a step of ``REQUEST_BATCH`` equal
        requests (an agentic append on a cached prefix, ``REQUEST_SPAN``) less what the grid's
        points give for it, over the extra requests (at least 0)."""
        c, n = REQUEST_SPAN
        at = {(p.cached_len, p.new_len): p.seconds for p in grid}
        k = REQUEST_BATCH
        rule = at[(0, k * n)] + k * (at[(c, n)] - at[(0, n)])
        return max(0.0, (self.prefill_min([REQUEST_SPAN] * k, repeats) - rule) / (k - 1))

    def decode_point(self, batch: int, context_len: int) -> DecodePoint:
        """Median decode step of ``batch`` requests of ``context_len`` tokens."""
        rids = []
        for _ in range(batch):
            _s, done = self._timed_step([(context_len - self.block_size, self.block_size)])
            rid, ids, tok = done[0]
            assert self.de.add_request(rid, ids, tok, GREEDY)
            rids.append(rid)
        self.de.step()  # warm-up
        steps = []
        for _ in range(DECODE_STEPS):
            t0 = time.thread_time()
            self.de.step()
            steps.append(time.thread_time() - t0)
        for rid in rids:
            self.de.abort(rid)
        return DecodePoint(batch=batch, context_len=context_len, seconds=min(steps))

    def join_min(self, prompt_len: int, repeats: int) -> float:
        best = float("inf")
        for _ in range(repeats):
            _s, done = self._timed_step([(prompt_len - self.block_size, self.block_size)])
            rid, ids, tok = done[0]
            t0 = time.thread_time()
            assert self.de.add_request(rid, ids, tok, GREEDY)
            best = min(best, time.thread_time() - t0)
            self.de.abort(rid)
        return best

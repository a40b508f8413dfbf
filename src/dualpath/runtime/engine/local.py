"""The whole data path in one process: store + I/O engine, one PE, DEs, and a transport between them.

``LocalPipeline.generate(requests)`` runs a set of requests end to end: hits from the store's prefix
match, DE buffer reservation (and DE-side reads on the DE path), layerwise prefill in batches planned
by ``dualpath.policy`` (the policy's batching: dualpath's compute quota over a measured attention
predictor, see ``profile.py``, or a token budget; both chunk), then batched decoding with block
persistence. It is what the correctness tests, ``dualpath check`` and the benchmarks drive; the
multi-process cluster drives the same engine classes step by step. ``LocalConfig.transport``
"inproc" (default) hands KV over by a call; a cross-process transport's name (``zmq``, ``shm``,
``mooncake``, ``nixl``: ``runtime.transfer.factory``) gives each engine one of its own, routed to
the others, so every Layer Block and control message crosses that transport's wire.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from dualpath.core.errors import ConfigError, require
from dualpath.core.registry import lookup
from dualpath.core.units import MiB
from dualpath.policy import AttentionTimePredictor, BatchView, SchedulerConfig, make_scheduler
from dualpath.policy.config import COMPUTE_QUOTA_S
from dualpath.policy.prefill import choose_read
from dualpath.policy.views import ReadSide
from dualpath.runtime.choices import TRANSPORT_NAMES
from dualpath.runtime.engine.decode import DecodeConfig, DecodeEngine
from dualpath.runtime.engine.prefill import PrefillConfig, PrefillEngine
from dualpath.runtime.engine.profile import attention_predictor
from dualpath.runtime.engine.types import KVGeometry, PrefillOutput, PrefillRequest, SamplingParams
from dualpath.runtime.kvstore import BlockStore, IOEngine, IOEngineConfig
from dualpath.runtime.kvstore.backends import MooncakeSpec, open_backend
from dualpath.runtime.model import Decoder
from dualpath.runtime.transfer import InProcFabric, Transport

LOCAL_TRANSPORTS = ("inproc", *TRANSPORT_NAMES)  # LocalConfig.transport's choices


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalConfig:
    """One-process pipeline settings; ``kv_dir`` is the store directory.

    ``policy`` plans the prefill batches with its own batching mode unless ``batching`` overrides it
    ("quota": ``compute_quota_s`` of predicted attention per forward pass, with
    ``attention_predictor`` or, when None, one measured on the decoder at start; "tokens":
    ``max_batch_tokens`` new tokens per batch).
    """

    kv_dir: str
    block_size: int = 64
    num_decode_engines: int = 1
    buffer_bytes: int = 64 * MiB
    num_cache_blocks: int = 256
    max_cached_tokens: int = 8192
    max_batch_tokens: int = 512
    overlap: bool = True
    io_queue_depth: int = 4
    store_capacity_bytes: int | None = None
    async_transfer: bool = False  # in-process transport with a progress thread
    transport: str = "inproc"  # or a cross-process transport: one per engine (module docstring)
    kv_backend: str = "posix"  # the store's backend (kvstore/backends.py); mooncake needs ``mooncake``
    mooncake: MooncakeSpec | None = None
    policy: str = "dualpath"
    batching: str | None = None  # None: the policy's default mode
    compute_quota_s: float = COMPUTE_QUOTA_S
    attention_predictor: AttentionTimePredictor | None = None  # None: measured (cached per model)

    def __post_init__(self) -> None:
        require(self.num_decode_engines >= 1, "num_decode_engines", self.num_decode_engines, ">= 1")
        require(self.max_batch_tokens >= 1, "max_batch_tokens", self.max_batch_tokens, ">= 1")
        lookup(dict.fromkeys(LOCAL_TRANSPORTS), self.transport, "transport")


@dataclass(frozen=True, slots=True, kw_only=True)
class GenRequest:
    """One request of a ``generate`` call: prompt tokens, read path, decode engine index.
    ``read_side`` "split": the hits divided as the policy's ``split_read`` divides them between two
    idle read queues of one rate (about half each, whole blocks; one side when that leaves the
    other none, as the policy's plan would say)."""

    request_id: str
    token_ids: tuple[int, ...]
    read_side: ReadSide = "pe"
    decode_engine: int = 0
    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass(frozen=True, slots=True, kw_only=True)
class Generation:
    """Result: generated tokens, the logits each was chosen from, and the prefix-hit tokens used."""

    request_id: str
    tokens: tuple[int, ...]
    logits: tuple[torch.Tensor, ...]
    hit_tokens: int
    read_side: ReadSide  # as carried out (a "split" of one hit block reads on one side)


class LocalPipeline:
    """See module docstring. Use as a context manager (closes the I/O engine and loader thread)."""

    def __init__(self, decoder: Decoder, config: LocalConfig) -> None:
        self.config = cfg = config
        self.decoder = decoder
        self.geometry = KVGeometry.of(decoder.config, decoder.dtype, cfg.block_size)
        Path(cfg.kv_dir).mkdir(parents=True, exist_ok=True)
        backend = open_backend(cfg.kv_backend, cfg.kv_dir, self.geometry.layout, mooncake=cfg.mooncake)
        self.store = BlockStore(cfg.kv_dir, self.geometry.layout, cfg.store_capacity_bytes, backend=backend)
        self.io = IOEngine(self.store, IOEngineConfig(queue_depth=cfg.io_queue_depth))
        self.transports = _transports(cfg, 1 + cfg.num_decode_engines)
        self.transport = self.transports[0]
        self.prefill = PrefillEngine(decoder, self.transport, self.io, PrefillConfig(
            name="pe0", block_size=cfg.block_size, buffer_bytes=cfg.buffer_bytes,
            max_cached_tokens=cfg.max_cached_tokens, overlap=cfg.overlap))  # fmt: skip
        self.decode = [
            DecodeEngine(
                decoder,
                self.transports[1 + i],
                self.io,
                DecodeConfig(
                    name=f"de{i}",
                    block_size=cfg.block_size,
                    buffer_bytes=cfg.buffer_bytes,
                    num_cache_blocks=cfg.num_cache_blocks,
                ),
            )  # fmt: skip
            for i in range(cfg.num_decode_engines)
        ]
        for de in self.decode:
            self.prefill.connect(de.config.name, de)
        _route(self.transports, [["pe0", "pe0.buffer"], *([de.config.name] for de in self.decode)])
        sched_cfg = SchedulerConfig(
            batching=cfg.batching, compute_quota_s=cfg.compute_quota_s,
            attention_predictor=cfg.attention_predictor, max_batch_tokens=cfg.max_batch_tokens,
            block_size=cfg.block_size)  # fmt: skip
        self.scheduler = make_scheduler(cfg.policy, sched_cfg)
        if self.scheduler.batching == "quota" and cfg.attention_predictor is None:
            # only quota batching reads the predictor: measure it just then
            self.scheduler = make_scheduler(
                cfg.policy, replace(sched_cfg, attention_predictor=attention_predictor(decoder))
            )
        self.prefill_batches: list[tuple[tuple[str, int], ...]] = []  # (request_id, chunk_len) per step
        self._sides: dict[str, ReadSide] = {}  # read side of each request being generated

    @property
    def num_prefill_steps(self) -> int:
        return len(self.prefill_batches)

    def __enter__(self) -> LocalPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.prefill.close()
        self.io.close()
        for t in dict.fromkeys(self.transports):
            t.close()
        self.store.close()

    def generate(self, requests: Sequence[GenRequest]) -> dict[str, Generation]:
        """Prefill all ``requests`` (batched, chunked), then decode them together."""
        hits: dict[str, int] = {}
        for r in requests:
            self._admit(r)
        firsts = self._run_prefill(hits)
        toks: dict[str, list[int]] = {rid: [o.first_token] for rid, o in firsts.items()}
        logits: dict[str, list[torch.Tensor]] = {rid: [o.logits] for rid, o in firsts.items()}
        for r in requests:
            de = self.decode[r.decode_engine]
            if not de.add_request(r.request_id, r.token_ids, firsts[r.request_id].first_token, r.sampling):
                raise ConfigError("num_cache_blocks", self.config.num_cache_blocks,
                                  f"too small for request {r.request_id!r}")  # fmt: skip
        while any(de.num_running for de in self.decode):
            for de in self.decode:
                for out in de.step():
                    toks[out.request_id].append(out.token)
                    logits[out.request_id].append(out.logits)
        return {
            r.request_id: Generation(
                request_id=r.request_id,
                tokens=tuple(toks[r.request_id]),
                logits=tuple(logits[r.request_id]),
                hit_tokens=hits[r.request_id],
                read_side=self._sides.pop(r.request_id),
            )  # fmt: skip
            for r in requests
        }

    def _admit(self, r: GenRequest) -> None:
        require(0 <= r.decode_engine < len(self.decode), "decode_engine", r.decode_engine,
                f"must be in [0, {len(self.decode)})")  # fmt: skip
        de, bs = self.decode[r.decode_engine], self.geometry.block_size
        matched = tuple(self.store.match_prefix(r.token_ids))
        matched = matched[: self.geometry.max_hit_blocks(len(r.token_ids))]
        side, first = r.read_side, 0
        if side == "split":
            side, pe_len, _ = choose_read("split", len(matched) * bs, [0.0, 1.0], [0.0, 1.0], bs)
            first = pe_len // bs if side == "split" else 0
        if not de.reserve(r.request_id, len(r.token_ids), matched[first:] if side != "pe" else (), first):
            raise ConfigError(
                "buffer_bytes", self.config.buffer_bytes, f"DE buffer full for {r.request_id!r}"
            )
        req = PrefillRequest(request_id=r.request_id, token_ids=r.token_ids, read_side=side,
                             decode_endpoint=de.config.name, hit_hashes=matched, sampling=r.sampling,
                             split_block=first if side == "split" else 0)  # fmt: skip
        self._sides[r.request_id] = side
        if not self.prefill.add_request(req):
            de.abort(r.request_id)
            raise ConfigError(
                "buffer_bytes", self.config.buffer_bytes, f"PE buffer full for {r.request_id!r}"
            )

    def _run_prefill(self, hits: dict[str, int]) -> dict[str, PrefillOutput]:
        done: dict[str, PrefillOutput] = {}
        while self.prefill.num_requests:
            waiting = tuple(self.prefill.waiting())
            if not waiting:  # hit reads still in flight
                time.sleep(0.0005)
                continue
            plan = self.scheduler.plan_prefill_batch(BatchView(now_s=0.0, engine_id=0, waiting=waiting))
            self.prefill_batches.append(tuple((e.request_id, e.chunk_len) for e in plan.entries))
            for out in self.prefill.step(plan):
                done[out.request_id] = out
                hits[out.request_id] = out.hit_tokens
        return done


def _transports(cfg: LocalConfig, n: int) -> list[Transport]:
    """One in-process transport for every engine, or ``n`` of ``cfg.transport`` (PE first)."""
    if cfg.transport == "inproc":
        return [InProcFabric().transport(asynchronous=cfg.async_transfer)] * n
    from dualpath.runtime.transfer.factory import make_transport

    made: list[Transport] = []
    try:
        for _ in range(n):
            made.append(make_transport(cfg.transport))
    except BaseException:
        for t in made:
            t.close()
        raise
    return made


def _route(transports: list[Transport], endpoints: list[list[str]]) -> None:
    """Tell each cross-process transport where the others' endpoints live."""
    if len(set(map(id, transports))) == 1:
        return
    for i, t in enumerate(transports):
        for j, names in enumerate(endpoints):
            for name in names if j != i else ():
                t.add_route(name, transports[j].address)  # type: ignore[attr-defined]

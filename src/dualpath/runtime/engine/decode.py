"""Decode engine (DE): its DRAM buffer (DE side of prefill) and batched decoding from a paged cache.

Prefill time: ``reserve`` allocates the request's prompt slots in the DE buffer (the endpoint the PE
sends KV to) and, on the DE read path, reads the hit blocks from the store into it; the PE pulls
them layer by layer (``request_layer``, the ``RemoteKV`` protocol). On a split read it reads its
share (the hit blocks from ``first_block`` on) and pushes every layer of it into the PE buffer
(``pushed_share``). Decode time: ``add_request``
copies the complete prompt KV from the buffer into the paged cache, frees the buffer slots and
persists the prompt's full blocks; every ``step`` runs all running requests one token and persists
each block as soon as it fills (spec section 4). Not thread-safe: one driver (the transport may
deliver into the buffer from other threads).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from dualpath.core.errors import ConfigError
from dualpath.core.units import MiB
from dualpath.runtime.engine.kvbuffer import KVBuffer, loaded_prefix_tokens
from dualpath.runtime.engine.paged import PagedKVCache
from dualpath.runtime.engine.sampling import sample_token
from dualpath.runtime.engine.types import DecodeOutput, KVGeometry, SamplingParams
from dualpath.runtime.kvstore import IOEngine, ReadResult, block_hash
from dualpath.runtime.model import Decoder, Span
from dualpath.runtime.transfer import TransferHandle, Transport

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeConfig:
    """``buffer_bytes``: DE DRAM buffer; ``num_cache_blocks``: paged cache (HBM) size in blocks."""

    name: str = "de0"
    block_size: int = 64
    buffer_bytes: int = 64 * MiB
    num_cache_blocks: int = 256
    persist: bool = True


class _Running:
    __slots__ = ("rid", "tokens", "ctx_len", "block_ids", "run_start", "table", "sampling",
                 "num_generated", "parent", "num_hashed", "writes")  # fmt: skip

    def __init__(self, rid: str, tokens: list[int], block_ids: list[int], sampling: SamplingParams) -> None:
        self.rid = rid
        self.tokens = tokens  # prompt + generated; the last one has no KV yet
        self.ctx_len = len(tokens) - 1
        self.block_ids = block_ids
        self.run_start = PagedKVCache.run_start(block_ids)  # not None: the cache is read in place
        self.table: torch.Tensor | None = None
        self.sampling = sampling
        self.num_generated = 1  # the PE sampled the first token
        self.parent: str | None = None
        self.num_hashed = 0
        self.writes: list[Future[bool]] = []


class DecodeEngine:
    """One decode engine over one decoder (see module docstring). Implements ``RemoteKV``."""

    def __init__(
        self,
        decoder: Decoder,
        transport: Transport,
        io: IOEngine | None = None,
        config: DecodeConfig | None = None,
    ) -> None:
        self.config = cfg = config or DecodeConfig()
        self.decoder = decoder
        self.transport = transport
        self.io = io
        self.geometry = KVGeometry.of(decoder.config, decoder.dtype, cfg.block_size)
        self.buffer = KVBuffer(self.geometry, cfg.buffer_bytes, name=cfg.name)
        self.cache = PagedKVCache(self.geometry, cfg.num_cache_blocks, decoder.device)
        self._reads: dict[str, list[Future[ReadResult]]] = {}
        self._running: dict[str, _Running] = {}
        transport.bind(cfg.name, self.buffer)

    # ----- DE side of prefill ------------------------------------------------------------------
    def reserve(
        self, request_id: str, prompt_len: int, hit_hashes: Sequence[str] = (), first_block: int = 0
    ) -> bool:
        """Allocate the prompt's DE buffer slots; with ``hit_hashes`` (the DE's share of the hits:
        the request's blocks from ``first_block`` on; all of them on the DE read path) read them.

        False (nothing changed) when the buffer has no room now."""
        blocks = self.buffer.allocate(request_id, prompt_len)
        if blocks is None:
            return False
        hits = list(hit_hashes)[: max(self.geometry.max_hit_blocks(prompt_len) - first_block, 0)]
        if hits:
            if self.io is None:
                self.buffer.free(request_id)
                raise ConfigError("io", None, "DE-path hits need an IOEngine on the decode engine")
            outs = blocks.arrays[first_block : first_block + len(hits)]
            self._reads[request_id] = self.io.submit_blocks(hits, outs=outs)
        return True

    def loaded_hit_tokens(self, request_id: str) -> int | None:
        return loaded_prefix_tokens(self._reads.get(request_id, []), self.geometry.block_size)

    def request_layer(self, request_id: str, layer: int, start: int, stop: int, dest: str) -> TransferHandle:
        return self.buffer.send_layer(request_id, layer, start, stop, dest, self.transport)

    def pushed_share(
        self, request_id: str, first_block: int, hashes: Sequence[str], dest: str
    ) -> list[Future[ReadResult]]:
        """``RemoteKV``: once the share ``reserve`` started reading is in, push every layer of its
        loaded prefix to ``dest`` (the PE buffer); each block's future resolves after that."""
        reads = self._reads.get(request_id, [])
        if len(reads) != len(hashes):
            raise ConfigError("hashes", len(hashes), f"{request_id!r} reads {len(reads)} blocks here")
        out: list[Future[ReadResult]] = [Future() for _ in hashes]
        bs, left, lock = self.geometry.block_size, [len(reads)], threading.Lock()

        def resolve(num_ok: int, error: BaseException | None = None) -> None:
            for i, (h, f) in enumerate(zip(hashes, out, strict=True)):
                f.set_result(ReadResult(block_hash=h, layer=None, ok=error is None and i < num_ok,
                                        data=None))  # fmt: skip

        def push() -> None:  # (on the thread finishing the last read)
            n = loaded_prefix_tokens(reads, bs) or 0
            if n == 0:
                resolve(0)
                return
            start, stop, pending = first_block * bs, first_block * bs + n, [self.geometry.num_layers]

            def sent(h: TransferHandle) -> None:
                with lock:
                    pending[0] -= 1
                    now = not out[0].done() and (h.error is not None or pending[0] == 0)
                    if now:
                        resolve(n // bs, h.error)

            for layer in range(self.geometry.num_layers):
                items = self.buffer.layer_items(request_id, layer, start, stop)
                self.transport.submit(dest, items, source=self.config.name, callback=sent)

        def one(_: Future[ReadResult]) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                push()

        for f in reads:
            f.add_done_callback(one)
        return out

    # ----- decode ------------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: Sequence[int],
        first_token: int,
        sampling: SamplingParams,
        num_generated: int = 0,
    ) -> bool:
        """Move the (complete) prompt KV from the DE buffer into the paged cache and start decoding.
        ``num_generated``: the prompt ends with that many tokens an earlier attempt generated (a
        resumed request), so ``first_token`` is generated token ``num_generated`` and sampling
        goes on from step ``num_generated + 1``.

        Returns False (nothing changed) if the cache lacks blocks for prompt + generation."""
        ids = self.cache.allocate(len(prompt) + sampling.max_tokens - num_generated)
        if ids is None:
            return False
        blocks = self.buffer.blocks(request_id)
        for k in range(self.geometry.num_blocks(len(prompt))):
            self.cache.write_block(ids[k], blocks.tensors[k])
        self.buffer.free(request_id)
        self._reads.pop(request_id, None)
        st = _Running(request_id, [*prompt, first_token], ids, sampling)
        st.num_generated += num_generated
        self._persist_full_blocks(st)
        if st.num_generated >= sampling.max_tokens or first_token in sampling.stop_token_ids:
            self._release(st)
        else:
            self._running[request_id] = st
        return True

    @property
    def num_running(self) -> int:
        return len(self._running)

    def step(self) -> list[DecodeOutput]:
        """One token for every running request (DEs batch everything); finished ones are released."""
        batch = list(self._running.values())
        if not batch:
            return []
        dec = self.decoder
        spans = [Span(st.ctx_len, 1) for st in batch]
        for st in batch:
            if st.table is None:
                st.table = self.cache.index(st.block_ids)
        hidden = dec.embed([st.tokens[-1] for st in batch])
        rope = dec.rope(dec.positions(spans))
        gathered = [j for j, st in enumerate(batch) if st.run_start is None]
        for layer in range(dec.num_layers):
            # one row more than the context: the decoder writes the new token's KV there, which is
            # the cache itself for a view; a gathered copy is written back after the layer
            cached = [self.cache.context(layer, st.run_start, st.table, st.ctx_len + 1)  # type: ignore[arg-type]
                      for st in batch]  # fmt: skip
            hidden, kv = dec.run_layer(layer, hidden, spans, cached, rope, cache_has_room=True)
            for j in gathered:
                st = batch[j]
                self.cache.write_token(layer, st.block_ids, st.ctx_len, kv[j])
        logits = dec.final(hidden)
        outs = []
        for j, st in enumerate(batch):
            tok = sample_token(logits[j], st.sampling, st.num_generated)
            st.tokens.append(tok)
            st.ctx_len += 1
            st.num_generated += 1
            self._persist_full_blocks(st)
            done = st.num_generated >= st.sampling.max_tokens or tok in st.sampling.stop_token_ids
            outs.append(DecodeOutput(request_id=st.rid, token=tok, logits=logits[j], finished=done))
            if done:
                del self._running[st.rid]
                self._release(st)
        return outs

    def _persist_full_blocks(self, st: _Running) -> None:
        """Write every block whose tokens all have KV now and that was not written yet."""
        bs = self.geometry.block_size
        while (st.num_hashed + 1) * bs <= st.ctx_len:
            k = st.num_hashed
            ids = st.tokens[k * bs : (k + 1) * bs]
            h = block_hash(st.parent, ids)
            if self.io is not None and self.config.persist:
                data = self.cache.block_bytes(st.block_ids[k])
                st.writes.append(self.io.submit_write(h, st.parent, ids, data))
            st.parent, st.num_hashed = h, k + 1

    def _release(self, st: _Running) -> None:
        for f in st.writes:  # the cache block must not be reused before its write finished
            if f.exception() is not None:  # a failed persist only loses a future hit
                log.warning("decode %s: persisting a block of %s failed: %s",
                            self.config.name, st.rid, f.exception())  # fmt: skip
        self.cache.free(st.block_ids)

    def abort(self, request_id: str) -> None:
        """Drop a request wherever it is (buffer or running)."""
        for f in self._reads.pop(request_id, []):
            f.exception()
        self.buffer.free(request_id)
        st = self._running.pop(request_id, None)
        if st is not None:
            self._release(st)

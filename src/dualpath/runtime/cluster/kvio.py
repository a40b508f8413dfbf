"""Shared pieces of the engine workers: model geometry, block reads/writes through the traffic
manager, sampling, and the engine's outbox of messages to the scheduler."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from dualpath.runtime.cluster.api import SamplingParams
from dualpath.runtime.cluster.traffic import TrafficManager
from dualpath.runtime.kvstore import BlockLayout, BlockStore, chain_hashes
from dualpath.runtime.model import Decoder

DONE_LAYER = -2  # TransferItem.layer of the PE's "prefill finished" marker (payload: first token)


@dataclass(frozen=True, slots=True, kw_only=True)
class Geometry:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    block_size: int

    @classmethod
    def of(cls, decoder: Decoder, block_size: int) -> Geometry:
        c = decoder.config
        return cls(num_layers=c.num_layers, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                   dtype=decoder.dtype, block_size=block_size)

    def layout(self) -> BlockLayout:
        per = 2 * self.num_kv_heads * self.head_dim * torch.empty(0, dtype=self.dtype).element_size()
        return BlockLayout(num_layers=self.num_layers, kv_bytes_per_token_layer=per,
                           block_size=self.block_size)

    def alloc(self, num_tokens: int) -> torch.Tensor:
        """A request's KV buffer ``[layers, tokens, 2, kv_heads, head_dim]``."""
        return torch.empty((self.num_layers, num_tokens, 2, self.num_kv_heads, self.head_dim),
                           dtype=self.dtype)


class Outbox:
    """Thread-safe list of messages for the scheduler (drained by the engine's main loop)."""

    def __init__(self) -> None:
        self._items: list[object] = []
        self._lock = threading.Lock()

    def put(self, msg: object) -> None:
        with self._lock:
            self._items.append(msg)

    def drain(self) -> list[object]:
        with self._lock:
            out, self._items = self._items, []
        return out


class BlockIO:
    """Reads and persists Full Blocks on I/O threads, paying the emulated SNIC for each block."""

    def __init__(self, store: BlockStore, geo: Geometry, traffic: TrafficManager) -> None:
        self.store, self.geo, self.traffic = store, geo, traffic
        self._reads = ThreadPoolExecutor(1, thread_name_prefix="kv-read")
        self._writes = ThreadPoolExecutor(1, thread_name_prefix="kv-write")
        self.read_queue_tokens = 0
        self._lock = threading.Lock()

    def read_blocks(self, token_ids: list[int], first_block: int, num_blocks: int, dest: torch.Tensor,
                    path: str, done: Callable[[BaseException | None], None]) -> Future[None]:
        """Read blocks [first, first+num) of ``token_ids``'s chain into ``dest[:, tokens]``."""
        bs = self.geo.block_size
        with self._lock:
            self.read_queue_tokens += num_blocks * bs
        # Join the node's SNIC queue now (submission order), not when the I/O thread gets to it.
        end_s = self.traffic.reserve_read(self.geo.layout().full_block_bytes * num_blocks, path)

        def job() -> None:
            err: BaseException | None = None
            try:
                hashes = chain_hashes(token_ids[: (first_block + num_blocks) * bs], bs)
                buf = np.empty(self.geo.layout().full_block_bytes, dtype=np.uint8)
                for b in range(first_block, first_block + num_blocks):
                    if not self.store.read_full_into(hashes[b], buf):
                        raise RuntimeError(f"KV block {b} ({hashes[b][:8]}) vanished or is corrupt")
                    blk = torch.from_numpy(buf).view(self.geo.dtype).view(
                        self.geo.num_layers, bs, 2, self.geo.num_kv_heads, self.geo.head_dim)
                    dest[:, b * bs:(b + 1) * bs].copy_(blk)
                wait_s = end_s - time.monotonic()
                if wait_s > 0:
                    time.sleep(wait_s)
            except BaseException as exc:  # reported to the caller, never lost
                err = exc
            with self._lock:
                self.read_queue_tokens -= num_blocks * bs
            done(err)

        return self._reads.submit(job)

    def persist(self, token_ids: list[int], kv: torch.Tensor, first_block: int, end_block: int,
                after: Callable[[], None] | None = None) -> None:
        """Write blocks [first, end) of ``token_ids`` (KV in ``kv[:, tokens]``); then run ``after``
        on the writer thread (so it runs after every earlier persist of this engine)."""
        bs = self.geo.block_size
        ids = list(token_ids[: end_block * bs])
        data = kv[:, first_block * bs:end_block * bs].clone() if end_block > first_block else None

        def job() -> None:
            try:
                if data is not None:
                    hashes = chain_hashes(ids, bs)
                    for i, b in enumerate(range(first_block, end_block)):
                        parent = hashes[b - 1] if b > 0 else None
                        blk = data[:, i * bs:(i + 1) * bs].contiguous()
                        raw = blk.view(torch.uint8).numpy().reshape(-1)
                        if self.store.write_full(hashes[b], parent, ids[b * bs:(b + 1) * bs], raw):
                            self.traffic.storage_write(raw.nbytes)
            finally:
                if after is not None:
                    after()

        self._writes.submit(job)

    def close(self) -> None:
        self._reads.shutdown(wait=False, cancel_futures=True)
        self._writes.shutdown(wait=True)


def sample(logits: torch.Tensor, params: SamplingParams, index: int) -> int:
    """One token from ``logits [vocab]``: greedy at temperature 0, else seeded top-p sampling."""
    if params.temperature == 0.0:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sp, si = torch.sort(probs, descending=True)
        keep = torch.cumsum(sp, 0) - sp < params.top_p
        probs = torch.zeros_like(probs).scatter_(0, si[keep], sp[keep])
    gen = torch.Generator().manual_seed((params.seed or 0) * 1_000_003 + index)
    return int(torch.multinomial(probs, 1, generator=gen).item())

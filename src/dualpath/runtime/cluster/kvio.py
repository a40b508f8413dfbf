"""Shared pieces of the engine workers: model geometry, block reads/writes through the traffic
manager (the engines' I/O), and the engine's outbox of messages to the scheduler."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from dualpath.runtime.cluster.traffic import TrafficManager
from dualpath.runtime.kvstore import BlockLayout, BlockStore
from dualpath.runtime.model import Decoder


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
        return cls(
            num_layers=c.num_layers,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            dtype=decoder.dtype,
            block_size=block_size,
        )

    def layout(self) -> BlockLayout:
        per = 2 * self.num_kv_heads * self.head_dim * torch.empty(0, dtype=self.dtype).element_size()
        return BlockLayout(
            num_layers=self.num_layers, kv_bytes_per_token_layer=per, block_size=self.block_size
        )


class Outbox:
    """Thread-safe list of messages for the scheduler (drained by the engine's main loop), plus an
    express list sent at once by the heartbeat thread (``put_express``: read completions, so the
    scheduler's read queues do not stay long while the main thread runs a prefill batch)."""

    def __init__(self) -> None:
        self._items: list[object] = []
        self._express: list[object] = []
        self._lock = threading.Lock()
        self.wake = threading.Event()

    def put(self, msg: object) -> None:
        with self._lock:
            self._items.append(msg)

    def put_express(self, msg: object) -> None:
        with self._lock:
            self._express.append(msg)
        self.wake.set()

    def drain(self) -> list[object]:
        with self._lock:
            out, self._items = self._items, []
        return out

    def drain_express(self) -> list[object]:
        with self._lock:
            self.wake.clear()
            out, self._express = self._express, []
        return out


class BlockIO:
    """Reads and persists Full Blocks on I/O threads, paying the emulated SNIC for each block."""

    def __init__(self, store: BlockStore, geo: Geometry, traffic: TrafficManager) -> None:
        self.store, self.geo, self.traffic = store, geo, traffic
        self._reads = ThreadPoolExecutor(1, thread_name_prefix="kv-read")
        self._writes = ThreadPoolExecutor(1, thread_name_prefix="kv-write")
        self.read_queue_tokens = 0
        self._lock = threading.Lock()

    def read_into(
        self,
        hashes: list[str],
        outs: list[np.ndarray],
        path: str,
        done: Callable[[int, BaseException | None], None],
    ) -> Future[None]:
        """Read Full Blocks ``hashes`` into the uint8 arrays ``outs`` (one per block) on the read
        thread, paying this node's SNIC; then ``done(num_read, error or None)`` on that thread:
        the leading ``num_read`` blocks are in ``outs``. A miss (a block vanished, or failed its
        checksum and was quarantined) ends the run there, the caller recomputes the rest;
        ``error`` is an unexpected failure."""
        num_tokens = len(hashes) * self.geo.block_size
        with self._lock:
            self.read_queue_tokens += num_tokens
        # Join the node's SNIC queue now (submission order), not when the I/O thread gets to it.
        end_s = self.traffic.reserve_read(self.geo.layout().full_block_bytes * len(hashes), path)

        def job() -> None:
            err: BaseException | None = None
            num_read = 0
            try:
                for h, out in zip(hashes, outs, strict=True):
                    if not self.store.read_full_into(h, out):
                        break
                    num_read += 1
                self.traffic.wait_read(end_s)  # (re-timed if the SNIC cap changes meanwhile)
            except BaseException as exc:  # reported to the caller, never lost
                err = exc
            with self._lock:
                self.read_queue_tokens -= num_tokens
            done(num_read, err)

        return self._reads.submit(job)

    def submit_write(
        self, block_hash: str, parent: str | None, token_ids: Sequence[int], data: np.ndarray
    ) -> Future[bool]:
        """``IOEngine.submit_write`` for ``runtime/engine``'s DecodeEngine: copies ``data`` now (so the
        cache block may be reused at once) and persists it on the writer thread through this node's
        SNIC. The returned future is already resolved; ``after_writes`` orders work after the write."""
        raw, ids = np.array(data, dtype=np.uint8, copy=True).reshape(-1), list(token_ids)

        def job() -> None:
            if self.store.write_full(block_hash, parent, ids, raw):
                self.traffic.storage_write(raw.nbytes)

        self._writes.submit(job)
        done: Future[bool] = Future()
        done.set_result(True)
        return done

    def after_writes(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the writer thread after every write submitted so far."""
        self._writes.submit(fn)

    def close(self) -> None:
        self._reads.shutdown(wait=False, cancel_futures=True)
        self._writes.shutdown(wait=True)

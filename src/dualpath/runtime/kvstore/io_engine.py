"""IOEngine: asynchronous block reads/writes with a bounded queue depth, into reusable buffers.

A thread pool of ``queue_depth`` workers runs store reads and writes (the read/write syscalls release
the GIL). Submissions never block on I/O; they return a ``Future[ReadResult]`` (an optional callback
runs on completion in the worker thread). ``read_queue_tokens`` counts tokens' worth of KV queued or
in flight, which is the scheduler's ``read_q``. An optional ``BandwidthLimiter`` caps the bytes/s
of reads and writes together, to emulate a storage NIC shared by the engines of one node.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from dualpath.core.errors import require
from dualpath.runtime.kvstore.bandwidth import BandwidthLimiter, wait_until
from dualpath.runtime.kvstore.buffers import BufferLease, BufferPool
from dualpath.runtime.kvstore.io_types import IOEngineConfig, IOStats, ReadResult
from dualpath.runtime.kvstore.store import BlockStore

Callback = Callable[[ReadResult], None]
_Job = tuple[str, np.ndarray, BufferLease | None, "Future[ReadResult]"]  # hash, out, lease, future


class IOEngine:
    """Reads and writes of one ``BlockStore`` with at most ``queue_depth`` I/Os in flight.

    ``pool`` supplies buffers for reads submitted without ``out`` (one slot per read; a submit
    waits for a free slot, up to ``timeout_s``, then raises BufferPoolExhausted). ``limiter``
    (optional, shareable) caps bandwidth. Use as a context manager or call ``close``.
    """

    def __init__(
        self,
        store: BlockStore,
        config: IOEngineConfig | None = None,
        *,
        pool: BufferPool | None = None,
        limiter: BandwidthLimiter | None = None,
    ) -> None:
        self.store = store
        self.config = config or IOEngineConfig()
        self.pool = pool
        self.limiter = limiter
        self._exec = ThreadPoolExecutor(self.config.queue_depth, thread_name_prefix="kvstore-io")
        ready = threading.Barrier(self.config.queue_depth + 1)
        for _ in range(self.config.queue_depth):  # start every worker now, not on the first reads
            self._exec.submit(ready.wait, 10.0)
        try:
            ready.wait(10.0)
        except threading.BrokenBarrierError:  # a very loaded machine: workers start later instead
            pass
        self._lock = threading.Lock()
        self._c = {k: 0 for k in IOStats.__slots__ if k != "read_queue_tokens"}

    # ----- reads -------------------------------------------------------------------------------
    def submit_full(
        self,
        block_hash: str,
        out: np.ndarray | None = None,
        callback: Callback | None = None,
        timeout_s: float | None = None,
    ) -> Future[ReadResult]:
        """Queue a Full Block read into ``out`` (or a pooled buffer)."""
        outs = None if out is None else [out]
        return self.submit_blocks([block_hash], outs, None, callback, timeout_s)[0]

    def submit_layer(
        self,
        block_hash: str,
        layer: int,
        out: np.ndarray | None = None,
        callback: Callback | None = None,
        timeout_s: float | None = None,
    ) -> Future[ReadResult]:
        """Queue one Layer Block read into ``out`` (or a pooled buffer)."""
        outs = None if out is None else [out]
        return self.submit_blocks([block_hash], outs, layer, callback, timeout_s)[0]

    def submit_blocks(
        self,
        hashes: Sequence[str],
        outs: Sequence[np.ndarray] | None = None,
        layer: int | None = None,
        callback: Callback | None = None,
        timeout_s: float | None = None,
    ) -> list[Future[ReadResult]]:
        """Queue reads of a request's blocks (Full Blocks, or one layer of each).

        Batched: at most ``queue_depth`` work items, block i going to item ``i % queue_depth``,
        so futures complete roughly in order. Without ``outs``, all the request's buffers are taken
        from the pool first (all or none; the request must fit in the pool). Queued blocks are
        pinned (not evicted by this process) until their read ends.
        """
        require(outs is None or len(outs) == len(hashes), "outs", len(outs or ()), "one per hash")
        if layer is not None:
            self.store.layout.layer_range(layer)  # validates
        leases = self._acquire_all(len(hashes), timeout_s) if outs is None else None
        layout = self.store.layout
        nbytes = layout.full_block_bytes if layer is None else layout.layer_block_bytes
        jobs: list[_Job] = [
            (h, outs[i] if outs is not None else leases[i].array[:nbytes],  # type: ignore[index]
             None if leases is None else leases[i], Future())
            for i, h in enumerate(hashes)
        ]  # fmt: skip
        if callback is not None:
            for job in jobs:
                job[3].add_done_callback(lambda f: callback(f.result()))
        with self._lock:
            self._c["read_queue_bytes"] += nbytes * len(jobs)
        self.store.pin(hashes)
        k = self.config.queue_depth
        for start in range(min(k, len(jobs))):
            try:
                self._exec.submit(self._run_batch, jobs[start::k], layer, nbytes)
            except BaseException:  # e.g. submitted after close(): undo what was not queued
                for h, _, lease, _ in (job for s in range(start, k) for job in jobs[s::k]):
                    self._drop_read(h, nbytes, lease)
                raise
        return [job[3] for job in jobs]

    def _acquire_all(self, n: int, timeout_s: float | None) -> list[BufferLease]:
        require(self.pool is not None, "out", None, "IOEngine has no BufferPool; pass outs")
        assert self.pool is not None
        require(n <= self.pool.num_buffers, "hashes", n, f"more blocks than the pool's "
                f"{self.pool.num_buffers} buffers")  # fmt: skip
        leases: list[BufferLease] = []
        try:
            for _ in range(n):
                leases.append(self.pool.acquire(timeout_s))
        except BaseException:
            for lease in leases:
                lease.release()
            raise
        return leases

    def _run_batch(self, jobs: list[_Job], layer: int | None, nbytes: int) -> None:
        for h, out, lease, fut in jobs:
            if not fut.set_running_or_notify_cancel():  # cancelled while queued: undo
                self._drop_read(h, nbytes, lease)
                continue
            try:
                fut.set_result(self._read(h, layer, out, lease, nbytes))
            except BaseException as err:  # delivered through the future
                fut.set_exception(err)

    def _read(
        self, h: str, layer: int | None, out: np.ndarray, lease: BufferLease | None, nbytes: int
    ) -> ReadResult:
        try:
            finish_s = self.limiter.reserve(nbytes) if self.limiter is not None else 0.0
            if layer is None:
                ok = self.store.read_full_into(h, out)
            else:
                ok = self.store.read_layer_into(h, layer, out)
            wait_until(finish_s)
        except BaseException:
            self._drop_read(h, nbytes, lease)
            raise
        self.store.unpin((h,))
        with self._lock:
            c = self._c
            c["read_queue_bytes"] -= nbytes
            c["num_reads"] += 1
            c["read_bytes"] += nbytes if ok else 0
            c["num_read_misses"] += 0 if ok else 1
        if not ok and lease is not None:
            lease.release()
            lease = None
        return ReadResult(block_hash=h, layer=layer, ok=ok, data=out if ok else None, lease=lease)

    def _drop_read(self, h: str, nbytes: int, lease: BufferLease | None) -> None:
        """Undo a read that will not complete: unpin its block, take its bytes off the read
        queue and return its pooled buffer."""
        self.store.unpin((h,))
        with self._lock:
            self._c["read_queue_bytes"] -= nbytes
        if lease is not None:
            lease.release()

    # ----- writes ------------------------------------------------------------------------------
    def submit_write(
        self,
        block_hash: str,
        parent_hash: str | None,
        token_ids: Sequence[int] | np.ndarray,
        data: np.ndarray,
    ) -> Future[bool]:
        """Queue ``store.write_full``; the future gives its result. ``data`` must stay unchanged
        until the future completes (no copy is made)."""
        nbytes = self.store.layout.full_block_bytes
        with self._lock:
            self._c["write_queue_bytes"] += nbytes
        return self._exec.submit(self._write, block_hash, parent_hash, token_ids, data, nbytes)

    def _write(
        self, h: str, parent: str | None, ids: Sequence[int] | np.ndarray, data: np.ndarray, n: int
    ) -> bool:
        try:
            finish_s = self.limiter.reserve(n) if self.limiter is not None else 0.0
            written = self.store.write_full(h, parent, ids, data)
            wait_until(finish_s if written else 0.0)
        finally:
            with self._lock:
                self._c["write_queue_bytes"] -= n
        with self._lock:
            self._c["num_writes"] += int(written)
            self._c["written_bytes"] += n if written else 0
        return written

    # ----- state -------------------------------------------------------------------------------
    @property
    def read_queue_bytes(self) -> int:
        with self._lock:
            return self._c["read_queue_bytes"]

    @property
    def read_queue_tokens(self) -> int:
        """Tokens' worth of KV (all layers) queued or in flight for reading, rounded up."""
        return self._tokens(self.read_queue_bytes)

    def stats(self) -> IOStats:
        with self._lock:
            c = dict(self._c)
        return IOStats(read_queue_tokens=self._tokens(c["read_queue_bytes"]), **c)

    def _tokens(self, nbytes: int) -> int:
        return -(-nbytes // self.store.layout.kv_bytes_per_token)

    def close(self) -> None:
        """Wait for queued I/O, then stop the workers."""
        self._exec.shutdown(wait=True)

    def __enter__(self) -> IOEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

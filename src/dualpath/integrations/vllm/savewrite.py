"""The connector's saves: a step's staged Full Blocks, written in the step or by a background thread.

``save_kv_layer`` gathers the store blocks that became whole in a step into one staging buffer,
layer-major ``[num_layers, n_blocks, layer_block_bytes]`` (one contiguous row per layer holding
every block of the step: one ``index_select`` per layer). ``SaveWriter`` persists them as Full
Blocks through ``BlockStore.write_full`` (atomic rename, crc32 per layer: a block is visible to
lookups only once its file is complete):

- ``write``: in the calling thread, before the step ends. For blocks another instance reads next
  (a P/D prefill answers once its step is done, and the decode instance then looks them up).
- ``submit``: in the writer's thread, after the step: the bytes are already out of vLLM's paged
  cache, so vLLM may reuse its blocks at once. The thread runs at the engine's priority: a lower
  one (nice) would let a busy machine preempt it while it holds the GIL, stalling the engine's
  thread behind it. ``pending_bytes`` is bounded
  (``max_pending_bytes``: a ``submit`` beyond it waits for the writer). ``wait_for(hashes)`` blocks
  until those blocks are written (the connector calls it before it reads a hit this instance is
  still writing), ``flush`` until everything is; ``close`` flushes and stops the thread.

A write that fails (the store counts OSErrors per cause; anything else raised is logged here) is
counted in ``counters["failed_blocks"]`` and publishes nothing; the thread goes on with the next
block, and nothing is raised into vLLM's step. Staging buffers come from a ``StagingPool`` and go
back to it once written: a fresh 28 MB array would pay its page faults inside the step.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from dualpath.runtime.kvstore import BlockStore
from dualpath.runtime.kvstore.bandwidth import BandwidthLimiter

log = logging.getLogger("dualpath.integrations.vllm")
_LOGGED_ERRORS = 8  # unexpected write errors logged with their traceback; later ones only counted


@dataclass(frozen=True, slots=True)
class StagedBlock:
    """One Full Block of a staging buffer: its chain hash, parent, token ids and its index in the
    buffer's block dimension."""

    block_hash: str
    parent_hash: str | None
    token_ids: tuple[int, ...]
    column: int


class StagingPool:
    """Flat uint8 buffers for staging, reused (at most ``keep`` held while unused). Thread-safe."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()
        self.allocated = 0  # buffers made (a reused one is not counted again)

    def take(self, nbytes: int) -> np.ndarray:
        """A buffer of at least ``nbytes`` (the smallest free one that fits, else a new one)."""
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if len(b) >= nbytes]
            if fits:
                return self._free.pop(min(fits, key=lambda i: len(self._free[i])))
            self.allocated += 1
        return np.empty(nbytes, dtype=np.uint8)

    def give(self, buf: np.ndarray) -> None:
        """Return a buffer; beyond ``keep`` free ones the smallest is dropped."""
        with self._lock:
            self._free.append(buf)
            if len(self._free) > self.keep:  # (by position: arrays compare elementwise)
                self._free.pop(min(range(len(self._free)), key=lambda i: len(self._free[i])))


@dataclass(slots=True)
class _Job:
    stage: np.ndarray  # [num_layers, n_blocks, layer_block_bytes]
    blocks: Sequence[StagedBlock]
    buf: np.ndarray | None  # the pool buffer under ``stage`` (given back once written)
    nbytes: int


class SaveWriter:
    """Writes staged Full Blocks to ``store``, in the caller (``write``) or in its own thread
    (``submit``). ``limiter``: persists are booked on the storage NIC's outbound side (without
    waiting, as the engine's persists). ``on_written``: called in the writer's thread after each
    job (the connector rewrites its counters file)."""

    def __init__(self, store: BlockStore, *, limiter: BandwidthLimiter | None = None,
                 pool: StagingPool | None = None, max_pending_bytes: int = 256 << 20,
                 on_written: Callable[[], None] | None = None) -> None:  # fmt: skip
        self.store = store
        self.limiter = limiter
        self.pool = pool or StagingPool()
        self.max_pending_bytes = max_pending_bytes
        self.on_written = on_written
        self._cv = threading.Condition()
        self._inflight: dict[str, int] = {}  # hash -> jobs queued or running that write it
        self._pending_bytes = 0
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._scratch = threading.local()  # one Full Block, contiguous, per writing thread
        self._logged = 0
        self._closed = False
        self.counters = {"saved_blocks": 0, "written_bytes": 0, "failed_blocks": 0, "async_blocks": 0}
        self.timing = {"async_write_s": 0.0}
        self._thread = threading.Thread(target=self._run, name="dualpath-save", daemon=True)
        self._thread.start()

    # ----- writing -----------------------------------------------------------------------------
    def write(self, stage: np.ndarray, blocks: Sequence[StagedBlock]) -> None:
        """Write ``blocks`` of ``stage`` now, in this thread."""
        for b in blocks:
            self._write_one(stage, b)

    def submit(self, stage: np.ndarray, blocks: Sequence[StagedBlock], buf: np.ndarray | None = None) -> None:
        """Queue ``blocks`` of ``stage`` for the writer's thread (``stage`` must stay unchanged
        until they are written; ``buf``, the pool buffer under it, goes back to the pool then).
        Waits while more than ``max_pending_bytes`` are queued. After ``close``: written here."""
        if not blocks:
            if buf is not None:
                self.pool.give(buf)
            return
        nbytes = len(blocks) * self.store.layout.full_block_bytes
        with self._cv:
            if not self._closed:
                while self._pending_bytes and self._pending_bytes + nbytes > self.max_pending_bytes:
                    self._cv.wait()
                self._pending_bytes += nbytes
                for b in blocks:
                    self._inflight[b.block_hash] = self._inflight.get(b.block_hash, 0) + 1
                self._queue.put(_Job(stage, blocks, buf, nbytes))
                return
        self.write(stage, blocks)  # closed (shutdown): nothing runs the queue any more
        if buf is not None:
            self.pool.give(buf)

    def _write_one(self, stage: np.ndarray, b: StagedBlock) -> bool:
        layout = self.store.layout
        scratch = getattr(self._scratch, "buf", None)
        if scratch is None:
            scratch = self._scratch.buf = np.empty((layout.num_layers, layout.layer_block_bytes), np.uint8)
        try:
            np.copyto(scratch, stage[:, b.column])  # the Full Block's layers, back to back
            written = self.store.write_full(b.block_hash, b.parent_hash, b.token_ids, scratch.reshape(-1))
            failed = not written and not self.store.contains(b.block_hash)  # (else: already there)
        except Exception:  # a bug or a bad block must not stop the writer or the engine
            written, failed = False, True
            if self._logged < _LOGGED_ERRORS:
                self._logged += 1
                log.exception("DualPathConnector: saving block %s failed (not cached)", b.block_hash)
        with self._cv:
            if written:
                self.counters["saved_blocks"] += 1
                self.counters["written_bytes"] += layout.full_block_bytes
            self.counters["failed_blocks"] += int(failed)
        if written and self.limiter is not None:  # persists leave through the storage NIC's
            self.limiter.reserve(layout.full_block_bytes)  # outbound side, not holding anyone
        return written

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            t = time.perf_counter()
            n = 0
            try:
                for b in job.blocks:
                    n += self._write_one(job.stage, b)
            finally:
                if job.buf is not None:
                    self.pool.give(job.buf)
                with self._cv:
                    self.counters["async_blocks"] += n
                    self.timing["async_write_s"] += time.perf_counter() - t
                    self._pending_bytes -= job.nbytes
                    for b in job.blocks:
                        left = self._inflight[b.block_hash] - 1
                        if left:
                            self._inflight[b.block_hash] = left
                        else:
                            del self._inflight[b.block_hash]
                    self._cv.notify_all()
            if self.on_written is not None:
                try:
                    self.on_written()
                except Exception:  # pragma: no cover - a counters file that cannot be written
                    log.exception("DualPathConnector: on_written failed")

    # ----- waiting -----------------------------------------------------------------------------
    @property
    def pending_bytes(self) -> int:
        with self._cv:
            return self._pending_bytes

    def wait_for(self, hashes: Iterable[str], timeout_s: float | None = None) -> bool:
        """Wait until none of ``hashes`` is queued or being written; False on timeout."""
        wanted = list(hashes)
        with self._cv:
            return self._cv.wait_for(lambda: not any(h in self._inflight for h in wanted), timeout_s)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything submitted is written; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._pending_bytes, timeout_s)

    def close(self, timeout_s: float | None = 120.0) -> bool:
        """Write what is queued, then stop the thread (idempotent); False if it did not finish in
        ``timeout_s``. Later submits are written in the caller."""
        with self._cv:
            if self._closed:
                return not self._thread.is_alive()
            self._closed = True
        self._queue.put(None)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

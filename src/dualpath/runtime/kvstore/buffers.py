"""BufferPool: a fixed set of preallocated, pre-touched byte buffers, reused across reads.

First-touch page faults are slow on these machines, so all memory is allocated and written once at
construction; afterwards acquiring a buffer is a queue pop. The pool is bounded in bytes.
"""

from __future__ import annotations

import mmap
import queue
import threading

import numpy as np

from dualpath.core.errors import DualpathError, require
from dualpath.runtime.kvstore.blockfile import PAGE_BYTES as _PAGE


def _alloc_arena(nbytes: int) -> np.ndarray:
    """Page-aligned anonymous memory, backed by huge pages where the kernel allows (fewer TLB
    misses when copying whole blocks), every page touched now rather than on the first read."""
    arena = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            arena.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # pragma: no cover - kernel without THP
            pass
    array = np.frombuffer(arena, dtype=np.uint8)
    array[::_PAGE] = 1
    return array


class BufferPoolExhausted(DualpathError):
    """No buffer became free within the timeout."""


class BufferLease:
    """One buffer on loan. ``array`` is a uint8 array of ``pool.buffer_bytes``; release exactly once
    (a second release is ignored)."""

    __slots__ = ("_pool", "_released", "array", "slot")

    def __init__(self, pool: BufferPool, slot: int, array: np.ndarray) -> None:
        self._pool = pool
        self._released = False
        self.slot = slot
        self.array = array

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._pool._give_back(self.slot)


class BufferPool:
    """``num_buffers`` buffers of ``buffer_bytes`` each, carved from one preallocated array.

    Every buffer starts on a 4 KiB page boundary (usable for O_DIRECT reads).
    """

    def __init__(self, buffer_bytes: int, num_buffers: int) -> None:
        require(buffer_bytes >= 1, "buffer_bytes", buffer_bytes, "must be >= 1")
        require(num_buffers >= 1, "num_buffers", num_buffers, "must be >= 1")
        self.buffer_bytes = buffer_bytes
        self.num_buffers = num_buffers
        self._stride = -(-buffer_bytes // _PAGE) * _PAGE
        self._arena = _alloc_arena(self._stride * num_buffers)
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(num_buffers):
            self._free.put(slot)
        self._lock = threading.Lock()
        self._num_free = num_buffers

    @classmethod
    def bounded(cls, capacity_bytes: int, buffer_bytes: int) -> BufferPool:
        """As many ``buffer_bytes`` buffers as fit in ``capacity_bytes`` (at least one must fit)."""
        require(
            capacity_bytes >= buffer_bytes, "capacity_bytes", capacity_bytes,
            f"must hold at least one buffer of {buffer_bytes} bytes",
        )  # fmt: skip
        return cls(buffer_bytes, capacity_bytes // buffer_bytes)

    @property
    def capacity_bytes(self) -> int:
        return self.buffer_bytes * self.num_buffers

    @property
    def num_free(self) -> int:
        with self._lock:
            return self._num_free

    def acquire(self, timeout_s: float | None = None) -> BufferLease:
        """Take a free buffer, waiting up to ``timeout_s`` (None: forever)."""
        try:
            slot = self._free.get(timeout=timeout_s)
        except queue.Empty:
            raise BufferPoolExhausted(
                f"no free buffer of {self.buffer_bytes} bytes within {timeout_s} s "
                f"({self.num_buffers} in pool)"
            ) from None
        with self._lock:
            self._num_free -= 1
        return BufferLease(self, slot, self._slot_array(slot))

    def try_acquire(self) -> BufferLease | None:
        """A free buffer, or None if all are on loan (never waits)."""
        try:
            return self.acquire(timeout_s=0.0) if self.num_free else None
        except BufferPoolExhausted:
            return None

    def _slot_array(self, slot: int) -> np.ndarray:
        start = slot * self._stride
        return self._arena[start : start + self.buffer_bytes]

    def _give_back(self, slot: int) -> None:
        with self._lock:
            self._num_free += 1
        self._free.put(slot)

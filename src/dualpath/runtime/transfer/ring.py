"""A FIFO byte-range allocator over one buffer: the send rings of the shared-memory and one-sided
transports (``shm_transport.py``, ``onesided.py``).

``alloc(n)`` blocks until ``n`` contiguous bytes are free and returns their offset; ``free(offset)``
releases an allocation (in any order: space is reclaimed from the oldest live one, so a slow
transfer holds back the ring behind it, as a NIC's send queue does). Thread-safe.
"""

from __future__ import annotations

import threading
from collections import deque


class RingAllocator:
    """Offsets into a ring of ``capacity_bytes`` (see the module docstring)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self._live: deque[list[int]] = deque()  # [start, end, freed]
        self._head = 0
        self._cond = threading.Condition()

    def _fits(self, n: int) -> int | None:
        if not self._live:
            return 0
        tail = self._live[0][0]
        if self._head >= tail:
            if self._head + n <= self.capacity:
                return self._head
            return 0 if n < tail else None
        return self._head if self._head + n < tail else None

    def alloc(self, n: int, timeout_s: float = 30.0) -> int:
        with self._cond:
            start = self._fits(n)
            while start is None:
                if not self._cond.wait(timeout_s):
                    raise TimeoutError(f"send ring full for {timeout_s} s")
                start = self._fits(n)
            self._live.append([start, start + n, 0])
            self._head = start + n
            return start

    def free(self, start: int) -> None:
        with self._cond:
            for rec in self._live:
                if rec[0] == start and not rec[2]:
                    rec[2] = 1
                    break
            while self._live and self._live[0][2]:
                self._live.popleft()
            if not self._live:
                self._head = 0
            self._cond.notify_all()

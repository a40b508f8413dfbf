"""Bandwidth caps that let one machine emulate a storage NIC (SNIC), and a measure of the store's
own read rate (what the scheduler's alpha assumes when no SNIC cap is set).

A limiter models a link as a single server, the KV lane of the project's one link model
(:mod:`dualpath.core.links`): each transfer of n bytes is reserved a slot of ``n / rate`` seconds
after the link's previous reservation (with up to ``burst_bytes`` of credit after idle time: the
transfer counts as ready that much earlier); the caller does its real I/O and then waits until the
slot's finish time, so real I/O time overlaps the emulated transfer. ``TokenBucket`` is shared by
threads of one process; ``SharedTokenBucket`` by every process that opens the same state file
(engines of one emulated node). Both use ``time.monotonic`` (system-wide on Linux), so processes agree on the clock.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import time
from pathlib import Path
from typing import Protocol

from dualpath.core.errors import require
from dualpath.core.links import book

_STATE = struct.Struct("<d")


class BandwidthLimiter(Protocol):
    """A shared link: ``reserve(n)`` books n bytes and returns the monotonic time they finish."""

    rate_bytes_per_s: float

    def reserve(self, nbytes: int) -> float: ...


def wait_until(finish_s: float) -> None:
    """Sleep until ``time.monotonic() >= finish_s``."""
    delay = finish_s - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _book(free_s: float, now_s: float, nbytes: int, rate: float, burst_s: float) -> float:
    return book([free_s, 0.0], now_s - burst_s, nbytes / rate, "kv")


def measure_read_bytes_per_s(
    root: str | Path, nbytes: int = 16 << 20, chunk_bytes: int = 1 << 20, repeats: int = 3
) -> float:
    """Bytes/s this machine reads a just-written file under ``root`` in ``chunk_bytes`` preads
    (best of ``repeats``; the page cache included, as for the store's own reads of fresh blocks).
    The file is ``nbytes`` or a tenth of the free space there, whichever is smaller (at least one
    4 KiB page); it is removed before returning. Raises OSError if it cannot be written."""
    require(nbytes >= 4096, "nbytes", nbytes, "must be >= 4096")
    st = os.statvfs(root)
    nbytes = max(4096, min(nbytes, st.f_bavail * st.f_frsize // 10))
    chunk_bytes = max(4096, min(chunk_bytes, nbytes))
    nbytes -= nbytes % chunk_bytes
    path = Path(root) / f".read-rate-{os.getpid()}.{os.urandom(8).hex()}.tmp"
    block = os.urandom(chunk_bytes)
    # O_EXCL | O_NOFOLLOW: a planted file or link of that name is never opened, nor removed
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        for off in range(0, nbytes, chunk_bytes):
            os.pwrite(fd, block, off)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            for off in range(0, nbytes, chunk_bytes):
                os.pread(fd, chunk_bytes, off)
            best = min(best, time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return nbytes / max(best, 1e-9)


class TokenBucket:
    """In-process limiter at ``rate_bytes_per_s`` with ``burst_bytes`` of idle credit."""

    def __init__(self, rate_bytes_per_s: float, burst_bytes: int = 0) -> None:
        require(rate_bytes_per_s > 0, "rate_bytes_per_s", rate_bytes_per_s, "must be > 0")
        require(burst_bytes >= 0, "burst_bytes", burst_bytes, "must be >= 0")
        self.rate_bytes_per_s = float(rate_bytes_per_s)
        self._burst_s = burst_bytes / self.rate_bytes_per_s
        self._free_s = 0.0
        self._lock = threading.Lock()

    def reserve(self, nbytes: int) -> float:
        with self._lock:
            self._free_s = _book(self._free_s, time.monotonic(), nbytes, self.rate_bytes_per_s,
                                 self._burst_s)  # fmt: skip
            return self._free_s


class SharedTokenBucket:
    """Cross-process limiter: the link's free time lives in ``state_path`` under an flock.

    Every process (and thread) that opens the same path shares one emulated link. Costs one
    flock + pread + pwrite per reservation (a few microseconds).
    """

    def __init__(self, state_path: str | Path, rate_bytes_per_s: float, burst_bytes: int = 0) -> None:
        require(rate_bytes_per_s > 0, "rate_bytes_per_s", rate_bytes_per_s, "must be > 0")
        require(burst_bytes >= 0, "burst_bytes", burst_bytes, "must be >= 0")
        self.rate_bytes_per_s = float(rate_bytes_per_s)
        self.state_path = Path(state_path)
        self._burst_bytes = burst_bytes
        self._burst_s = burst_bytes / self.rate_bytes_per_s
        self._fd = -1
        self._pid = -1
        self._lock = threading.Lock()  # flock is per open file; serialise this process's threads

    def __reduce__(self) -> tuple[object, ...]:  # picklable: each process opens its own fd
        return (SharedTokenBucket, (self.state_path, self.rate_bytes_per_s, self._burst_bytes))

    def reserve(self, nbytes: int) -> float:
        with self._lock:
            if self._pid != os.getpid():  # first use, or inherited across fork: own open file
                self._fd = os.open(self.state_path, os.O_RDWR | os.O_CREAT, 0o644)
                self._pid = os.getpid()
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                raw = os.pread(self._fd, _STATE.size, 0)
                free_s = _STATE.unpack(raw)[0] if len(raw) == _STATE.size else 0.0
                free_s = _book(free_s, time.monotonic(), nbytes, self.rate_bytes_per_s,
                               self._burst_s)  # fmt: skip
                os.pwrite(self._fd, _STATE.pack(free_s), 0)
                return free_s
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd >= 0 and self._pid == os.getpid():
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()

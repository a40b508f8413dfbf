"""Value types of the IOEngine: its config, one read's result, its counters."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dualpath.core.errors import require
from dualpath.runtime.kvstore.buffers import BufferLease


@dataclass(frozen=True, slots=True, kw_only=True)
class IOEngineConfig:
    """``queue_depth``: concurrent I/Os (worker threads)."""

    queue_depth: int = 4

    def __post_init__(self) -> None:
        require(1 <= self.queue_depth <= 256, "queue_depth", self.queue_depth, "must be in [1, 256]")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadResult:
    """Outcome of one read. ``ok`` False means a miss (absent, vanished or corrupt): recompute.

    ``data`` views the caller's ``out`` or a pooled buffer (``lease``); call ``release()`` when done
    with pooled data (a no-op for caller buffers) so the buffer returns to the pool.
    """

    block_hash: str
    layer: int | None
    ok: bool
    data: np.ndarray | None
    lease: BufferLease | None = None

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()


@dataclass(frozen=True, slots=True, kw_only=True)
class IOStats:
    num_reads: int
    num_read_misses: int
    read_bytes: int
    num_writes: int
    written_bytes: int
    read_queue_bytes: int
    read_queue_tokens: int
    write_queue_bytes: int

"""Value types of the store and the IOEngine: the IOEngine's config, one read's result, the
counters of both."""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreStats:
    """Counters of one BlockStore since open.

    ``hit_tokens`` / ``miss_tokens``: whole-block tokens of prefix lookups (index hits: a hit
    whose read later fails is still counted here; the cluster's hit metric counts loaded blocks).
    ``num_corrupt``: blocks that failed verification (quarantined); ``num_rewrites``: blocks
    written again after this process saw them quarantined or vanished (healed);
    ``write_errors``: failed writes by cause ("ENOSPC", "EACCES", ...), ``num_write_errors`` their
    sum; ``num_evictions``: blocks deleted for capacity or disk space; ``num_links_refused``:
    symlinks found where the store expects its own file or directory (moved to quarantine, never
    followed).
    """

    num_blocks: int = 0
    used_bytes: int = 0
    capacity_bytes: int | None = None
    hit_tokens: int = 0
    miss_tokens: int = 0
    num_full_reads: int = 0
    num_layer_reads: int = 0
    read_bytes: int = 0
    num_read_misses: int = 0
    num_writes: int = 0
    written_bytes: int = 0
    num_evictions: int = 0
    num_corrupt: int = 0
    num_discovered: int = 0
    num_rewrites: int = 0
    num_write_errors: int = 0
    num_links_refused: int = 0
    write_errors: dict[str, int] = field(default_factory=dict)

    def health_counts(self) -> dict[str, int]:
        """The counters an operator watches (exported as ``dualpath_store_<key>_total``)."""
        return {
            "corrupt_blocks": self.num_corrupt,
            "evictions": self.num_evictions,
            "rewritten_blocks": self.num_rewrites,
            "written_blocks": self.num_writes,
            "refused_links": self.num_links_refused,
        }

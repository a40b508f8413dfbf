"""How the block store keeps within its space: the capacity bound, the free-space floor, and
writes that meet a full disk. A base class of ``BlockStore`` (it owns the index, lock, counters).

Eviction takes the least recently used unpinned leaf of this process's index (a block no other
indexed block depends on) and deletes its file, under the store's lock so index and disk agree.
"""

from __future__ import annotations

import errno
import logging
import threading
from pathlib import Path

import numpy as np

from dualpath.runtime.kvstore.backend import BlockBackend
from dualpath.runtime.kvstore.index import BlockIndex
from dualpath.runtime.kvstore.layout import BlockLayout
from dualpath.runtime.kvstore.limits import WriteErrors

log = logging.getLogger("dualpath.runtime.kvstore.store")
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class SpaceKeeping:
    root: Path
    backend: BlockBackend
    layout: BlockLayout
    file_bytes: int
    file_mode: int
    fsync: bool
    capacity_bytes: int | None
    min_free_bytes: int
    write_errors: WriteErrors
    _lock: threading.Lock
    _index: BlockIndex
    _c: dict[str, int]
    _warned_full: bool

    def _write(self, h: str, parent: str | None, ids: np.ndarray, view: memoryview) -> bool:
        """Write the file, making room first when the disk runs low; on ENOSPC evict and retry
        once. A failure is counted and logged once per cause; False then (nothing cached)."""
        self._keep_free()
        for attempt in (0, 1):
            try:
                self.backend.write(h, parent, ids, view)
                return True
            except OSError as err:
                if attempt == 0 and err.errno in _NO_SPACE and self._evict(2, None):
                    continue
                self.write_errors.record(err, h)
                return False
        return False  # pragma: no cover - the loop always returns

    def _keep_free(self) -> None:
        """Evict LRU leaves while the file system has less than ``min_free_bytes`` (plus one
        block) free: other writers may fill it beyond what this process's index knows."""
        if self.capacity_bytes is None or not self.min_free_bytes:
            return
        try:
            free = self.backend.free_bytes()
        except OSError:
            return
        if free is None:
            return
        short = self.min_free_bytes + self.file_bytes - free
        if short > 0:
            self._evict(-(-short // self.file_bytes), None)

    def _evict_over_capacity(self, protect: str | None) -> None:
        """Evict LRU leaves (never ``protect``, the block just written) until within capacity."""
        if self.capacity_bytes is not None:
            self._evict(None, protect)

    def _evict(self, n: int | None, protect: str | None) -> int:
        """Evict ``n`` LRU leaves (None: until within capacity); returns how many were."""
        done = 0
        while n is None or done < n:
            with self._lock:
                if n is None and self._index.used_bytes <= (self.capacity_bytes or 0):
                    break
                victim = self._index.pop_victim(protect)
                if victim is None:
                    if n is None and not getattr(self, "_warned_full", False):
                        self._warned_full = True  # once per store: it recurs on every write
                        log.warning(
                            "kvstore %s: over capacity but every block is pinned or interior", self.root
                        )
                    break
                self._c["num_evictions"] += 1
                self.backend.remove(victim)
            done += 1
        return done

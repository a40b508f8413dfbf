"""BlockStore: Full Blocks on a POSIX directory, addressed by chain hash, with a trie index and LRU.

Thread-safe (one lock around the index and counters; file I/O runs outside it). Several processes
may share one directory: writes are atomic renames, a vanished file is a miss, and hashes missing
from this process's index are looked up on the file system before a prefix match stops.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Literal

import numpy as np

from dualpath.core.errors import ConfigError, require
from dualpath.runtime.kvstore.backend import BlockBackend
from dualpath.runtime.kvstore.blockfile import BlockHeader, CorruptBlockError, file_bytes_for
from dualpath.runtime.kvstore.index import BlockIndex
from dualpath.runtime.kvstore.io_types import StoreStats
from dualpath.runtime.kvstore.layout import BlockLayout, block_hash, chain_hashes, check_hash
from dualpath.runtime.kvstore.limits import AUTO_SHARE, WriteErrors, check_file_mode
from dualpath.runtime.kvstore.posix_backend import PosixBackend
from dualpath.runtime.kvstore.space import SpaceKeeping

log = logging.getLogger(__name__)
_LOST_KEEP = 4096  # hashes this process saw quarantined or vanished (to count re-persists)
__all__ = ["BlockStore", "StoreStats"]


class BlockStore(SpaceKeeping):
    """KV block store over ``root_dir`` (or over ``backend``, a ``BlockBackend``: see
    backend.py; default the POSIX directory ``root_dir``). See docs/kvstore.md.

    ``capacity_bytes`` bounds the file bytes this process's index holds ("auto", the default: the
    blocks already there plus 90% of the free space at open; None: unbounded); writes beyond it
    evict least-recently-used unpinned leaf blocks, as do writes while the file system has less
    than ``min_free_bytes`` free (default: the 10% of the free space at open left out of "auto").
    A write that fails (ENOSPC after eviction, EACCES, ...) is counted per cause, logged once per
    cause and reported as not written. Files get ``file_mode`` (0600; 0640 for a shared-FS group),
    directories the matching 0700 / 0750. ``verify`` checks crc32 on every read;
    ``fsync`` makes writes durable before they become visible. ``direct_io`` reads with O_DIRECT
    (bypassing the page cache, as on a storage system with no DRAM cache) whenever the target
    buffer is page-aligned (BufferPool buffers are). Opening scans ``root_dir`` (reading
    each block's header) and removes temp files older than ``stale_tmp_s``. Nothing under
    ``root_dir`` is reached through a symlink: links are refused, counted (``num_links_refused``)
    and moved into quarantine (``safedir``). A backend that cannot tell its free space
    (Mooncake Store evicts by itself) makes "auto" unbounded and the floor 0.
    """

    def __init__(
        self,
        root_dir: str | Path,
        layout: BlockLayout,
        capacity_bytes: int | None | Literal["auto"] = "auto",
        *,
        verify: bool = True,
        fsync: bool = False,
        direct_io: bool = False,
        stale_tmp_s: float = 300.0,
        file_mode: int = 0o600,
        min_free_bytes: int | None = None,
        backend: BlockBackend | None = None,
    ) -> None:
        require(
            capacity_bytes in (None, "auto") or (isinstance(capacity_bytes, int) and capacity_bytes >= 0),
            "capacity_bytes",
            capacity_bytes,
            ">= 0, None or 'auto'",
        )
        require(min_free_bytes is None or min_free_bytes >= 0, "min_free_bytes", min_free_bytes, ">= 0")
        self.root = Path(root_dir)
        self.layout = layout
        self.file_mode = check_file_mode(file_mode)
        self.verify = verify
        self.fsync = fsync
        self.direct_io = direct_io
        self.file_bytes = file_bytes_for(layout)
        self._lock = threading.Lock()
        self._index = BlockIndex()
        self._c = {f.name: 0 for f in fields(StoreStats) if "write_errors" not in f.name}
        self._lost: OrderedDict[str, None] = OrderedDict()
        self.write_errors = WriteErrors(self.root)
        if backend is None:
            backend = PosixBackend(
                self.root, layout, file_mode=self.file_mode, fsync=fsync, direct_io=direct_io
            )
        self.backend = backend
        free = backend.free_bytes()
        auto_floor = 0 if free is None else int((1 - AUTO_SHARE) * free)
        self.min_free_bytes = auto_floor if min_free_bytes is None else min_free_bytes
        self.capacity_bytes = None if capacity_bytes == "auto" else capacity_bytes
        self.rebuild(stale_tmp_s)
        if capacity_bytes == "auto" and free is not None:  # what is there plus the free share
            self.capacity_bytes = self._index.used_bytes + int(AUTO_SHARE * free)

    # ----- index -------------------------------------------------------------------------------
    def rebuild(self, stale_tmp_s: float = 300.0) -> int:
        """Rescan the directory into a fresh index (corrupt headers are quarantined; pins and LRU
        order are reset, so call it at open or when idle). Returns the number of blocks."""
        index = BlockIndex()
        for h in self.backend.scan(stale_tmp_s):
            header = self._safe_header(h)
            if header is not None:
                index.add(h, header.parent_hash, self.file_bytes)
        with self._lock:
            self._index = index
        self._evict_over_capacity(None)
        return len(index)

    def _safe_header(self, h: str) -> BlockHeader | None:
        try:
            return self.backend.read_header(h)
        except CorruptBlockError as err:
            self._report(err)
            return None

    def _report(self, err: CorruptBlockError) -> None:
        log.warning("kvstore: %s (quarantined, treated as a miss)", err)
        with self._lock:
            self._c["num_corrupt"] += 1
            self._index.remove(err.block_hash)
            self._note_lost(err.block_hash)

    def _note_lost(self, h: str) -> None:  # (under the lock)
        self._lost[h] = None
        self._lost.move_to_end(h)
        if len(self._lost) > _LOST_KEEP:
            self._lost.popitem(last=False)

    def _discover(self, h: str) -> bool:
        """Look for a block another process wrote; add it to the index if its header is sound."""
        header = self._safe_header(h)
        if header is None:
            return False
        with self._lock:  # re-check under the lock: an eviction here may have unlinked it since
            if h not in self._index and self.backend.exists(h):
                self._index.add(h, header.parent_hash, self.file_bytes)
                self._c["num_discovered"] += 1
            elif h not in self._index:
                return False
        self._evict_over_capacity(h)
        return True

    def contains(self, block_hash: str) -> bool:
        """True if the block is in the index or on disk (found blocks join the index)."""
        with self._lock:
            if block_hash in self._index:
                return True
        return self._discover(block_hash)

    def match_prefix(self, token_ids: Sequence[int] | np.ndarray, *, pin: bool = False) -> list[str]:
        """Hashes of the longest cached prefix of whole blocks of ``token_ids``; does not read data.

        Marks the matched blocks used. With ``pin`` they are also pinned (call ``unpin`` after the
        reads) so this process cannot evict them meanwhile. A block may still vanish if another
        process evicts it: reads then report a miss.
        """
        matched: list[str] = []
        wanted = chain_hashes(token_ids, self.layout.block_size)
        for h in wanted:
            if not self.contains(h):
                break
            matched.append(h)
        with self._lock:
            for h in matched:  # root first, so the deepest block is the most recent
                self._index.touch(h)
                if pin and self.capacity_bytes is not None and h in self._index:
                    self._index.pin(h)
            self._c["hit_tokens"] += len(matched) * self.layout.block_size
            self._c["miss_tokens"] += len(token_ids) - len(matched) * self.layout.block_size
        return matched

    def pin(self, hashes: Iterable[str]) -> None:
        """Protect known blocks from this process's eviction (counted; pair with ``unpin``)."""
        if self.capacity_bytes is None:
            return  # nothing is ever evicted
        with self._lock:
            for h in hashes:
                if h in self._index:
                    self._index.pin(h)

    def unpin(self, hashes: Iterable[str]) -> None:
        if self.capacity_bytes is None:
            return
        with self._lock:
            for h in hashes:
                self._index.unpin(h)

    # ----- reads -------------------------------------------------------------------------------
    def read_full(self, block_hash: str) -> np.ndarray | None:
        """A Full Block as a new uint8 array of ``layout.full_block_bytes``; None on a miss."""
        out = np.empty(self.layout.full_block_bytes, dtype=np.uint8)
        return out if self.read_full_into(block_hash, out) else None

    def read_layer(self, block_hash: str, layer: int) -> np.ndarray | None:
        """One Layer Block as a new uint8 array (only that byte range is read); None on a miss."""
        out = np.empty(self.layout.layer_block_bytes, dtype=np.uint8)
        return out if self.read_layer_into(block_hash, layer, out) else None

    def read_full_into(self, block_hash: str, out: np.ndarray | memoryview) -> bool:
        """Read a Full Block into ``out`` (contiguous, exactly full_block_bytes). False on a miss
        (absent, vanished or corrupt); then ``out``'s contents are undefined."""
        return self._read(block_hash, out, None)

    def read_layer_into(self, block_hash: str, layer: int, out: np.ndarray | memoryview) -> bool:
        """Read one Layer Block into ``out`` (exactly layer_block_bytes). False on a miss."""
        return self._read(block_hash, out, layer)

    def _read(self, h: str, out: np.ndarray | memoryview, layer: int | None) -> bool:
        view = _byte_view(out)
        want = self.layout.full_block_bytes if layer is None else self.layout.layer_block_bytes
        if len(view) != want:
            raise ConfigError("out", f"{len(view)} bytes", f"must be exactly {want} bytes")
        try:
            header = self.backend.read(h, view, layer, self.verify)
        except CorruptBlockError as err:
            self._report(err)
            header = None
        with self._lock:
            if header is None:
                self._c["num_read_misses"] += 1
                if h in self._index:
                    self._note_lost(h)
                self._index.remove(h)
                return False
            self._c["num_full_reads" if layer is None else "num_layer_reads"] += 1
            self._c["read_bytes"] += want
            self._index.touch(h)  # a read is a use; membership changes only via contains/writes
            return True

    # ----- writes ------------------------------------------------------------------------------
    def write_full(
        self,
        block_hash_: str,
        parent_hash: str | None,
        token_ids: Sequence[int] | np.ndarray,
        data: np.ndarray | memoryview | bytes,
    ) -> bool:
        """Persist one Full Block atomically. False if its file already exists (no write) or the
        write failed (counted in ``stats().write_errors``, logged once per cause; never raised).

        ``block_hash_`` must equal ``block_hash(parent_hash, token_ids)``; ``data`` is
        ``full_block_bytes`` contiguous bytes. May evict LRU leaves to stay within capacity or
        above the free-space floor. A block this index holds whose file is gone (quarantined or
        evicted by another process) is written again (``stats().num_rewrites``).
        """
        check_hash(block_hash_)
        ids = np.asarray(token_ids, dtype="<i8")
        require(len(ids) == self.layout.block_size, "token_ids", len(ids), "must be one block")
        if block_hash(parent_hash, ids) != block_hash_:
            raise ConfigError("block_hash", block_hash_, "is not block_hash(parent, token_ids)")
        view = _byte_view(data)
        want = self.layout.full_block_bytes
        require(len(view) == want, "data", f"{len(view)} bytes", f"must be exactly {want} bytes")
        if self._on_disk(block_hash_):
            return False
        if not self._write(block_hash_, parent_hash, ids, view):
            return False
        with self._lock:
            self._index.add(block_hash_, parent_hash, self.file_bytes)
            self._c["num_writes"] += 1
            self._c["written_bytes"] += self.file_bytes
            if self._lost.pop(block_hash_, 0) is None:
                self._c["num_rewrites"] += 1  # healed: a quarantined or vanished block is back
        self._evict_over_capacity(block_hash_)
        return True

    def _on_disk(self, h: str) -> bool:
        """Whether the block's file exists (an indexed block whose file vanished, e.g. quarantined
        by another process, leaves the index so that it is written again)."""
        with self._lock:
            indexed = h in self._index
        if not indexed:
            return self._discover(h)
        if self.backend.exists(h):
            return True
        with self._lock:
            self._index.remove(h)
            self._note_lost(h)
        return False

    def forget(self, hashes: Iterable[str]) -> None:
        """Drop blocks from this process's index only (files untouched): another process failed
        to load them, so the next lookup checks the file system again."""
        with self._lock:
            for h in hashes:
                self._index.remove(h)

    def discard(self, block_hash: str) -> bool:
        """Delete a block (from disk and index); False if it was not there."""
        with self._lock:
            self._index.remove(block_hash)
            return self.backend.remove(block_hash)

    def close(self) -> None:
        """Close the backend (the directory fd, also closed when the store is garbage-collected)."""
        self.backend.close()

    # ----- introspection -----------------------------------------------------------------------
    def stats(self) -> StoreStats:
        """A snapshot of the counters."""
        with self._lock:
            c: dict[str, object] = dict(self._c)
            c.update(
                num_blocks=len(self._index),
                used_bytes=self._index.used_bytes,
                capacity_bytes=self.capacity_bytes,
                num_links_refused=self.backend.links_refused,
            )
        errors = self.write_errors.snapshot()
        return StoreStats(**c, num_write_errors=sum(errors.values()), write_errors=errors)  # type: ignore[arg-type]

    def known_hashes(self) -> list[str]:
        """Hashes in this process's index, least recently used first."""
        with self._lock:
            return self._index.hashes()

    def parent_of(self, block_hash: str) -> str | None:
        """Parent hash of an indexed block (KeyError if unknown)."""
        with self._lock:
            return self._index.parent_of(block_hash)


def _byte_view(data: np.ndarray | memoryview | bytes) -> memoryview:
    view = memoryview(data)  # type: ignore[arg-type]
    if not view.c_contiguous:
        raise ConfigError("data", f"shape {view.shape}", "must be C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view

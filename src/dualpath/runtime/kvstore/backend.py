"""Where the block store keeps its Full Blocks: the storage backend interface.

``BlockStore`` (store.py) owns what holds on every backend: the chain-hash prefix index, LRU
eviction and pins, the counters; a backend moves one block file's bytes (the same on-disk format
everywhere, ``blockfile.py``: a header with one crc32 per Layer Block, then the layers) and keeps
three promises the store relies on:

- atomic visibility: a block is either absent or complete (a reader never sees a partial write);
- verified reads: ``read`` decodes the header against the layout and the expected hash and, with
  ``verify``, checks the crc32 of every Layer Block it returns; any failure raises
  ``CorruptBlockError`` after the block was moved aside (quarantined), so the next lookup misses;
- a vanished block is a miss (``None``/``False``), never an error.

Backends (``--kv-backend``, docs/kvstore.md): ``posix`` (the default; a directory, ``files.py``),
``nixl-posix`` (the same directory, block bytes moved by NIXL's POSIX plugin, ``nixl_backend.py``)
and ``mooncake`` (Mooncake Store, a distributed memory pool, ``mooncake_backend.py``).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator

import numpy as np

from dualpath.runtime.choices import KV_BACKEND_NAMES
from dualpath.runtime.kvstore.blockfile import BlockHeader

BACKEND_NAMES = KV_BACKEND_NAMES
DEFAULT_BACKEND = "posix"


class BlockBackend(abc.ABC):
    """One store's blocks somewhere. Thread-safe. ``where`` names it in messages."""

    name: str = ""
    where: str = ""

    @abc.abstractmethod
    def write(self, block_hash: str, parent: str | None, token_ids: np.ndarray, data: memoryview) -> None:
        """Persist a Full Block atomically (OSError on failure, nothing visible then)."""

    @abc.abstractmethod
    def read(self, block_hash: str, out: memoryview, layer: int | None, verify: bool) -> BlockHeader | None:
        """A Full Block (``layer`` None) or one Layer Block into ``out``; None when absent.
        CorruptBlockError (already quarantined) on a bad header, short block or failed crc."""

    @abc.abstractmethod
    def read_header(self, block_hash: str) -> BlockHeader | None:
        """The block's header (its size checked too); None if absent; CorruptBlockError if bad."""

    @abc.abstractmethod
    def exists(self, block_hash: str) -> bool:
        """Whether the block is there (complete)."""

    @abc.abstractmethod
    def scan(self, stale_tmp_s: float) -> Iterator[str]:
        """Hashes of the blocks present at open (a backend that cannot list yields none: its
        blocks are found by lookup); writes abandoned over ``stale_tmp_s`` ago are cleaned."""

    @abc.abstractmethod
    def remove(self, block_hash: str) -> bool:
        """Delete a block; False if it was already gone."""

    @abc.abstractmethod
    def free_bytes(self) -> int | None:
        """Bytes free for more blocks; None: unknown (the backend evicts by itself)."""

    @property
    def links_refused(self) -> int:
        """Symlinks refused where the store expects its own files (file-system backends)."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional
        """Release what the backend holds (fds, connections)."""

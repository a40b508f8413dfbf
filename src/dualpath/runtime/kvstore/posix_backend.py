"""The default storage backend (``--kv-backend posix``): one file per Full Block under a directory.

Everything is reached through directory fds with O_NOFOLLOW (``safedir.StoreDir``); a write is a
private temp file renamed over the final name (atomic visibility); a corrupt file is renamed into
``quarantine/`` only if it is still the one read (``quarantine.py``). See ``files.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

import dualpath.runtime.kvstore.files as files
from dualpath.runtime.kvstore.backend import BlockBackend
from dualpath.runtime.kvstore.blockfile import BlockHeader
from dualpath.runtime.kvstore.fileio import FileIO
from dualpath.runtime.kvstore.layout import BlockLayout
from dualpath.runtime.kvstore.limits import dir_mode_for, free_bytes
from dualpath.runtime.kvstore.safedir import StoreDir


class PosixBackend(BlockBackend):
    """Block files under ``root`` (created with ``dir_mode_for(file_mode)``), moved by ``io``
    (``fileio.FileIO``: os.pwritev/os.preadv; ``nixl_backend`` passes NIXL's)."""

    name = "posix"

    def __init__(
        self,
        root: str | Path,
        layout: BlockLayout,
        *,
        file_mode: int = 0o600,
        fsync: bool = False,
        direct_io: bool = False,
        io: FileIO | None = None,
    ) -> None:
        self.root = Path(root)
        self.where = str(self.root)
        self.layout = layout
        self.file_mode = file_mode
        self.fsync = fsync
        self.direct_io = direct_io
        self.io = io or FileIO()
        self.dir = StoreDir(self.root, dir_mode_for(file_mode))
        files.init_root(self.dir, layout, file_mode)

    def write(self, block_hash: str, parent: str | None, token_ids: np.ndarray, data: memoryview) -> None:
        files.write_block(
            self.dir, self.layout, block_hash, parent, token_ids, data, self.fsync, self.file_mode, self.io
        )

    def read(self, block_hash: str, out: memoryview, layer: int | None, verify: bool) -> BlockHeader | None:
        return files.read_block(
            self.dir, self.layout, block_hash, out, layer, verify, self.direct_io, self.io
        )

    def read_header(self, block_hash: str) -> BlockHeader | None:
        return files.read_header(self.dir, self.layout, block_hash, self.file_mode)

    def exists(self, block_hash: str) -> bool:
        return files.block_exists(self.dir, block_hash)

    def scan(self, stale_tmp_s: float) -> Iterator[str]:
        return files.scan(self.dir, stale_tmp_s)

    def remove(self, block_hash: str) -> bool:
        return files.remove_block(self.dir, block_hash)

    def free_bytes(self) -> int | None:
        return free_bytes(self.root)

    @property
    def links_refused(self) -> int:
        return self.dir.links_refused

    def close(self) -> None:
        self.dir.close()

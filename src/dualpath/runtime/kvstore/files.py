"""File-system operations of the block store: paths, atomic write, verified reads, quarantine, scan.

Directory layout under ``root``::

    kvstore.json            the BlockLayout (checked on open)
    ab/abcdef....kvb        one Full Block per file, fanned out by the first two hex digits
    ab/.tmp.<hash>.<pid>.<n> a write in progress (renamed over the final name when complete)
    quarantine/              corrupt files moved aside for inspection (bounded)

Every function here is safe against other processes using the same directory: files appear only by
rename, a vanished file is a miss, and quarantine moves a file only if it is still the one read.
"""

from __future__ import annotations

import errno
import itertools
import json
import mmap
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from dualpath.core.errors import ConfigError
from dualpath.runtime.kvstore.blockfile import (
    PAGE_BYTES,
    SUFFIX,
    BlockHeader,
    CorruptBlockError,
    crc_layers,
    decode_header,
    encode_header,
    file_bytes_for,
    header_bytes_for,
    verify_layers,
)
from dualpath.runtime.kvstore.layout import HASH_HEX_LEN, BlockLayout
from dualpath.runtime.kvstore.limits import dir_mode_for

META_NAME = "kvstore.json"
QUARANTINE_DIR = "quarantine"
TMP_PREFIX = ".tmp."
_tmp_counter = itertools.count()
_scratch = threading.local()


def _header_scratch(nbytes: int) -> memoryview:
    """A page-aligned per-thread buffer for headers (reused: decode_header copies what it keeps)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < nbytes:
        buf = _scratch.buf = mmap.mmap(-1, nbytes)
    return memoryview(buf)[:nbytes]


def _direct_ok(out: memoryview, offset: int) -> bool:
    """O_DIRECT needs page-aligned file offset, length and memory address."""
    if len(out) % PAGE_BYTES or offset % PAGE_BYTES:
        return False
    return int(np.frombuffer(out, dtype=np.uint8).ctypes.data) % PAGE_BYTES == 0


def block_path(root: Path, block_hash: str) -> Path:
    return root / block_hash[:2] / f"{block_hash}{SUFFIX}"


def _block_path_str(root: Path, block_hash: str) -> str:  # hot path: no pathlib objects
    return f"{root}/{block_hash[:2]}/{block_hash}{SUFFIX}"


def init_root(root: Path, layout: BlockLayout, file_mode: int = 0o600) -> None:
    """Create the directory tree and layout file, or check an existing layout matches ``layout``.

    Directories get ``dir_mode_for(file_mode)`` (0700 for 0600), also when they exist already and
    are ours (a tree made by an older version with 0755 is tightened; others' dirs are left)."""
    dmode = dir_mode_for(file_mode)
    root.mkdir(parents=True, exist_ok=True, mode=dmode)
    _chmod_own(root, dmode)
    meta = {
        "format": "dualpath-kvstore",
        "version": 1,
        "num_layers": layout.num_layers,
        "block_size": layout.block_size,
        "kv_bytes_per_token_layer": layout.kv_bytes_per_token_layer,
    }
    path = root / META_NAME
    if path.exists():
        found = json.loads(path.read_text())
        if found != meta:
            raise ConfigError("layout", layout, f"{root} holds blocks of another layout: {found}")
    else:
        tmp = root / f"{TMP_PREFIX}meta.{os.getpid()}.{next(_tmp_counter)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), file_mode)  # exact bits, whatever the umask
            f.write(json.dumps(meta, indent=1))
        os.replace(tmp, path)  # concurrent creators write identical content
    for name in [f"{i:02x}" for i in range(256)] + [QUARANTINE_DIR]:
        sub = root / name
        try:
            sub.mkdir(mode=dmode)
        except FileExistsError:
            pass
        _chmod_own(sub, dmode)


def _chmod_own(path: Path, mode: int) -> None:
    """Set ``path``'s permission bits to ``mode`` if they differ and it is ours (else leave it)."""
    try:
        st = os.stat(path)
        if st.st_mode & 0o7777 != mode and st.st_uid == os.geteuid():
            os.chmod(path, mode)
    except (FileNotFoundError, PermissionError):
        pass


def write_block(
    root: Path,
    layout: BlockLayout,
    block_hash: str,
    parent_hash: str | None,
    token_ids: np.ndarray,
    data: memoryview,
    fsync: bool,
    file_mode: int = 0o600,
) -> None:
    """Write a block atomically: a private temp file in the same directory, then rename over.

    Raises OSError (ENOSPC, EACCES, ENOTDIR, ...) with no temp file left behind."""
    header = encode_header(layout, block_hash, parent_hash, token_ids, crc_layers(data, layout))
    final = block_path(root, block_hash)
    tmp = final.parent / f"{TMP_PREFIX}{block_hash}.{os.getpid()}.{next(_tmp_counter)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(tmp, flags, file_mode)
    except FileNotFoundError:  # its fan-out directory was removed: make it again
        final.parent.mkdir(mode=dir_mode_for(file_mode), exist_ok=True)
        fd = os.open(tmp, flags, file_mode)
    try:
        os.fchmod(fd, file_mode)  # exact bits, whatever the umask
        _write_all(fd, [memoryview(header), data])
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, final)
    if fsync:
        dir_fd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _write_all(fd: int, parts: list[memoryview]) -> None:
    while parts:
        n = os.writev(fd, parts)
        while parts and n >= len(parts[0]):
            n -= len(parts[0])
            parts.pop(0)
        if parts and n:
            parts[0] = parts[0][n:]


def read_block(
    root: Path,
    layout: BlockLayout,
    block_hash: str,
    out: memoryview,
    layer: int | None,
    verify: bool,
    direct: bool = False,
) -> BlockHeader | None:
    """Read a Full Block (``layer`` None) or one Layer Block into ``out``; None if the file is absent.

    ``direct`` uses O_DIRECT (no page cache, no copy) when ``out`` is page-aligned, else buffered.
    Raises CorruptBlockError (with the file already quarantined) on a bad header, short file or a
    failed checksum of the bytes read; ``out`` then holds garbage and must not be used.
    """
    hdr = _header_scratch(header_bytes_for(layout))
    offset = len(hdr) + (0 if layer is None else layout.layer_range(layer)[0])
    flags = os.O_RDONLY | (os.O_DIRECT if direct and _direct_ok(out, offset) else 0)
    try:
        fd = os.open(_block_path_str(root, block_hash), flags)
    except (FileNotFoundError, NotADirectoryError):  # (a file in place of its directory: absent)
        return None
    except OSError as err:  # a file system without O_DIRECT
        if err.errno != errno.EINVAL or not flags & os.O_DIRECT:
            raise
        return read_block(root, layout, block_hash, out, layer, verify, direct=False)
    try:
        if layer is None:
            n = os.preadv(fd, [hdr, out], 0) - len(hdr)
        else:
            n = os.preadv(fd, [hdr], 0) - len(hdr)
            n = os.preadv(fd, [out], offset) if n >= 0 else n
        try:
            header = decode_header(hdr, layout, block_hash)
            if n != len(out):
                raise CorruptBlockError(block_hash, f"truncated: {n} of {len(out)} data bytes")
            if verify:
                verify_layers(header, out, layout, 0 if layer is None else layer)
        except CorruptBlockError:
            quarantine(root, block_hash, fd)
            raise
        return header
    finally:
        os.close(fd)


def read_header(
    root: Path, layout: BlockLayout, block_hash: str, file_mode: int | None = None
) -> BlockHeader | None:
    """Header of a block file (size checked too); None if absent; CorruptBlockError if bad.

    With ``file_mode``, a file of ours with other permission bits (e.g. 0644 from an older version)
    is set to it."""
    try:
        fd = os.open(block_path(root, block_hash), os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        try:
            st = os.fstat(fd)
            size = st.st_size
            if file_mode is not None and st.st_mode & 0o7777 != file_mode and st.st_uid == os.geteuid():
                os.fchmod(fd, file_mode)
            if size != file_bytes_for(layout):
                raise CorruptBlockError(block_hash, f"size {size} != {file_bytes_for(layout)}")
            return decode_header(os.pread(fd, header_bytes_for(layout), 0), layout, block_hash)
        except CorruptBlockError:
            quarantine(root, block_hash, fd)
            raise
    finally:
        os.close(fd)


def quarantine(root: Path, block_hash: str, fd: int, keep: int = 32) -> None:
    """Move the file open as ``fd`` aside, only if it is still the one at the block's path.

    Another process may have replaced it with a good copy since we opened it; that copy stays.
    """
    path = block_path(root, block_hash)
    try:
        seen, now = os.fstat(fd), os.stat(path)
        if (seen.st_ino, seen.st_dev) != (now.st_ino, now.st_dev):
            return
        qdir = root / QUARANTINE_DIR
        qdir.mkdir(mode=0o700, exist_ok=True)
        os.replace(path, qdir / f"{block_hash}.{os.getpid()}.{time.time_ns()}{SUFFIX}")
        old = sorted(qdir.iterdir(), key=lambda p: p.stat().st_mtime)
        for p in old[: max(0, len(old) - keep)]:
            p.unlink(missing_ok=True)
    except FileNotFoundError:
        return


def scan(root: Path, stale_tmp_s: float) -> Iterator[str]:
    """Hashes of block files under ``root``; deletes temp files older than ``stale_tmp_s``."""
    now = time.time()
    for sub in sorted(root.iterdir()):
        if len(sub.name) != 2 or not sub.is_dir():
            continue
        for entry in os.scandir(sub):
            name = entry.name
            if name.startswith(TMP_PREFIX):
                try:
                    if now - entry.stat().st_mtime >= stale_tmp_s:
                        os.unlink(entry.path)
                except FileNotFoundError:
                    pass
            elif name.endswith(SUFFIX) and len(name) == HASH_HEX_LEN + len(SUFFIX):
                yield name[:HASH_HEX_LEN]


def remove_block(root: Path, block_hash: str) -> bool:
    """Delete a block file; False if it was already gone."""
    try:
        os.unlink(block_path(root, block_hash))
        return True
    except (FileNotFoundError, NotADirectoryError):
        return False

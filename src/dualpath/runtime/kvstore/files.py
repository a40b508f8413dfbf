"""File-system operations of the block store: paths, atomic write, verified reads, quarantine, scan.

Directory layout under ``root``::

    kvstore.json            the BlockLayout (checked on open)
    ab/abcdef....kvb        one Full Block per file, fanned out by the first two hex digits
    ab/.tmp.<hash>.<pid>.<n> a write in progress (renamed over the final name when complete)
    quarantine/              corrupt files moved aside for inspection (bounded)

Every function here is safe against other processes using the same directory: files appear only by
rename, a vanished file is a miss, and quarantine moves a file only if it is still the one read.
Everything is reached through directory fds with O_NOFOLLOW (``safedir.StoreDir``): a symlink
where a shard, ``quarantine`` or a block file belongs is refused, never followed.
"""

from __future__ import annotations

import contextlib
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
from dualpath.runtime.kvstore.fileio import FileIO
from dualpath.runtime.kvstore.layout import HASH_HEX_LEN, BlockLayout
from dualpath.runtime.kvstore.limits import dir_mode_for
from dualpath.runtime.kvstore.quarantine import quarantine
from dualpath.runtime.kvstore.safedir import NOFOLLOW, QUARANTINE_DIR, StoreDir

META_NAME = "kvstore.json"
TMP_PREFIX = ".tmp."
_tmp_counter = itertools.count()
_OS_IO = FileIO()
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
    """Where a block's file lives (for people and tests; the store itself opens it by dir fd)."""
    return root / block_hash[:2] / f"{block_hash}{SUFFIX}"


def _names(block_hash: str) -> tuple[str, str]:  # hot path: no pathlib objects
    return block_hash[:2], f"{block_hash}{SUFFIX}"


def init_root(d: StoreDir, layout: BlockLayout, file_mode: int = 0o600) -> None:
    """Create the directory tree and layout file, or check an existing layout matches ``layout``.

    Directories get ``dir_mode_for(file_mode)`` (0700 for 0600), also when they exist already and
    are ours (a tree made by an older version with 0755 is tightened; others' dirs are left). A
    link in place of a shard, ``quarantine`` or the layout file is refused (``StoreDir``)."""
    dmode = dir_mode_for(file_mode)
    d.chmod_own(d.fd, dmode)
    meta = {
        "format": "dualpath-kvstore",
        "version": 1,
        "num_layers": layout.num_layers,
        "block_size": layout.block_size,
        "kv_bytes_per_token_layer": layout.kv_bytes_per_token_layer,
    }
    fd = d.open_file(d.fd, META_NAME, os.O_RDONLY)
    if fd is not None:
        with os.fdopen(fd) as f:
            found = json.loads(f.read())
        if found != meta:
            raise ConfigError("layout", layout, f"{d.root} holds blocks of another layout: {found}")
    else:
        tmp = f"{TMP_PREFIX}meta.{os.getpid()}.{next(_tmp_counter)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, file_mode, dir_fd=d.fd)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), file_mode)  # exact bits, whatever the umask
            f.write(json.dumps(meta, indent=1))
        os.replace(tmp, META_NAME, src_dir_fd=d.fd, dst_dir_fd=d.fd)  # concurrent creators agree
    for name in [f"{i:02x}" for i in range(256)] + [QUARANTINE_DIR]:
        with d.dir(name, create=True) as sub:
            if sub is not None:
                d.chmod_own(sub, dmode)


def write_block(
    d: StoreDir,
    layout: BlockLayout,
    block_hash: str,
    parent_hash: str | None,
    token_ids: np.ndarray,
    data: memoryview,
    fsync: bool,
    file_mode: int = 0o600,
    io: FileIO = _OS_IO,
) -> None:
    """Write a block atomically: a private temp file in its shard directory, then rename over.

    Raises OSError (ENOSPC, EACCES, ENOTDIR, ...) with no temp file left behind."""
    header = encode_header(layout, block_hash, parent_hash, token_ids, crc_layers(data, layout))
    shard, final = _names(block_hash)
    tmp = f"{TMP_PREFIX}{block_hash}.{os.getpid()}.{next(_tmp_counter)}"
    with d.dir(shard, create=True) as sfd:
        if sfd is None:
            raise NotADirectoryError(errno.ENOTDIR, f"{d.root}/{shard} is not a directory")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, file_mode, dir_fd=sfd)
        try:
            os.fchmod(fd, file_mode)  # exact bits, whatever the umask
            io.writev(fd, [memoryview(header), data])
            if fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=sfd)
            raise
        os.close(fd)
        os.replace(tmp, final, src_dir_fd=sfd, dst_dir_fd=sfd)  # replaces a link, never follows it
        if fsync:
            os.fsync(sfd)


def read_block(
    d: StoreDir,
    layout: BlockLayout,
    block_hash: str,
    out: memoryview,
    layer: int | None,
    verify: bool,
    direct: bool = False,
    io: FileIO = _OS_IO,
) -> BlockHeader | None:
    """Read a Full Block (``layer`` None) or one Layer Block into ``out``; None if the file is
    absent (or a link: refused, never read).

    ``direct`` uses O_DIRECT (no page cache, no copy) when ``out`` is page-aligned, else buffered.
    Raises CorruptBlockError (with the file already quarantined) on a bad header, short file or a
    failed checksum of the bytes read; ``out`` then holds garbage and must not be used.
    """
    hdr = _header_scratch(header_bytes_for(layout))
    offset = len(hdr) + (0 if layer is None else layout.layer_range(layer)[0])
    flags = os.O_RDONLY | (os.O_DIRECT if direct and _direct_ok(out, offset) else 0)
    shard, name = _names(block_hash)
    with d.dir(shard) as sfd:
        if sfd is None:  # absent (or a file in place of its directory: absent too)
            return None
        try:
            fd = d.open_file(sfd, name, flags, where=f"{shard}/{name}")
        except OSError as err:  # a file system without O_DIRECT
            if err.errno != errno.EINVAL or not flags & os.O_DIRECT:
                raise
            fd = d.open_file(sfd, name, os.O_RDONLY, where=f"{shard}/{name}")
        if fd is None:
            return None
        try:
            return _read_open(d, sfd, fd, layout, block_hash, hdr, out, layer, verify, io)
        finally:
            os.close(fd)


def _read_open(
    d: StoreDir,
    sfd: int,
    fd: int,
    layout: BlockLayout,
    block_hash: str,
    hdr: memoryview,
    out: memoryview,
    layer: int | None,
    verify: bool,
    io: FileIO,
) -> BlockHeader:
    if layer is None:
        n = io.readv(fd, [hdr, out], 0) - len(hdr)
    else:
        got = io.read_spans(fd, [(hdr, 0), (out, len(hdr) + layout.layer_range(layer)[0])])
        n = got[1] if got[0] == len(hdr) else got[0] - len(hdr)
    try:
        header = decode_header(hdr, layout, block_hash)
        if n != len(out):
            raise CorruptBlockError(block_hash, f"truncated: {n} of {len(out)} data bytes")
        if verify:
            verify_layers(header, out, layout, 0 if layer is None else layer)
    except CorruptBlockError:
        quarantine(d, sfd, block_hash, fd)
        raise
    return header


def read_header(
    d: StoreDir, layout: BlockLayout, block_hash: str, file_mode: int | None = None
) -> BlockHeader | None:
    """Header of a block file (size checked too); None if absent (or a link: refused);
    CorruptBlockError if bad.

    With ``file_mode``, a file of ours (one name, our uid) with other permission bits (e.g. 0644
    from an older version) is set to it."""
    shard, name = _names(block_hash)
    with d.dir(shard) as sfd:
        if sfd is None:
            return None
        fd = d.open_file(sfd, name, os.O_RDONLY, where=f"{shard}/{name}")
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
            if file_mode is not None:
                d.chmod_own(fd, file_mode)
            try:
                if size != file_bytes_for(layout):
                    raise CorruptBlockError(block_hash, f"size {size} != {file_bytes_for(layout)}")
                return decode_header(os.pread(fd, header_bytes_for(layout), 0), layout, block_hash)
            except CorruptBlockError:
                quarantine(d, sfd, block_hash, fd)
                raise
        finally:
            os.close(fd)


def block_exists(d: StoreDir, block_hash: str) -> bool:
    """Whether the block's file is there as a regular file (a link is not a block)."""
    shard, name = _names(block_hash)
    with d.dir(shard) as sfd:
        return sfd is not None and d.is_file(sfd, name)


def scan(d: StoreDir, stale_tmp_s: float) -> Iterator[str]:
    """Hashes of block files under the root; deletes temp files older than ``stale_tmp_s``.

    A shard directory that is a link is refused (moved to quarantine), never listed."""
    now = time.time()
    with os.scandir(d.fd) as it:
        shards = sorted(e.name for e in it if len(e.name) == 2)
    for shard in shards:
        with d.dir(shard) as sfd:
            if sfd is None:
                continue
            with os.scandir(sfd) as it:
                names = [e.name for e in it]
            for name in names:
                if name.startswith(TMP_PREFIX):
                    _drop_stale(sfd, name, now - stale_tmp_s)
                elif name.endswith(SUFFIX) and len(name) == HASH_HEX_LEN + len(SUFFIX):
                    yield name[:HASH_HEX_LEN]


def _drop_stale(sfd: int, name: str, cutoff_s: float) -> None:
    with contextlib.suppress(FileNotFoundError):
        if os.stat(name, dir_fd=sfd, follow_symlinks=False).st_mtime <= cutoff_s:
            os.unlink(name, dir_fd=sfd)  # unlink removes a name (a link itself), never a target


def remove_block(d: StoreDir, block_hash: str) -> bool:
    """Delete a block file's name; False if it was already gone."""
    shard, name = _names(block_hash)
    with d.dir(shard) as sfd:
        if sfd is None:
            return False
        try:
            os.unlink(name, dir_fd=sfd)
            return True
        except FileNotFoundError:
            return False

"""Quarantine: corrupt block files (and refused links) moved aside for inspection, bounded.

A corrupt block file is renamed to ``quarantine/<hash>.<pid>.<ns>.kvb``; a refused link to
``quarantine/<where>.<pid>.<ns>.link`` (``safedir``). Pruning keeps the newest ``keep`` of the
store's own entries and deletes only entries the store itself put there, told by name and header:
a ``.kvb`` entry must carry the quarantine name pattern, be a regular file of our uid with one
name, and start with the block file magic (or be shorter than it: a truncated block); a ``.link``
entry must carry the link name pattern and be a link. Anything else in the directory (an
operator's copies, a file that merely looks like ours) is never deleted.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time

from dualpath.runtime.kvstore.blockfile import MAGIC, SUFFIX
from dualpath.runtime.kvstore.safedir import LINK_SUFFIX, NOFOLLOW, StoreDir, is_quarantined_link_name

KEEP_ENTRIES = 32  # quarantined entries kept for inspection (older ones are deleted)
_BLOCK_NAME = re.compile(r"[0-9a-f]{32}\.\d+\.\d+" + re.escape(SUFFIX))


def quarantine(d: StoreDir, sfd: int, block_hash: str, fd: int, keep: int = KEEP_ENTRIES) -> None:
    """Move the block file open as ``fd`` (in shard ``sfd``) aside, only if it is still the one
    at its name: another process may have replaced it with a good copy since, which stays."""
    name = f"{block_hash}{SUFFIX}"
    try:
        seen, now = os.fstat(fd), os.stat(name, dir_fd=sfd, follow_symlinks=False)
        if (seen.st_ino, seen.st_dev) != (now.st_ino, now.st_dev):
            return
        qfd = d.quarantine_fd()
        try:
            dest = f"{block_hash}.{os.getpid()}.{time.time_ns()}{SUFFIX}"
            os.rename(name, dest, src_dir_fd=sfd, dst_dir_fd=qfd)
            prune(qfd, keep)
        finally:
            os.close(qfd)
    except FileNotFoundError:
        return


def prune(qfd: int, keep: int = KEEP_ENTRIES) -> int:
    """Delete the oldest of the store's own quarantine entries beyond ``keep``; returns how many."""
    with os.scandir(qfd) as it:
        names = [e.name for e in it]
    ours: list[tuple[float, str]] = []
    for name in names:
        st = _own_entry(qfd, name)
        if st is not None:
            ours.append((st.st_mtime, name))
    ours.sort()
    done = 0
    for _, name in ours[: max(0, len(ours) - keep)]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=qfd)  # removes this name only (never a link's target)
            done += 1
    return done


def _own_entry(qfd: int, name: str) -> os.stat_result | None:
    """The lstat of ``name`` if the store put it in quarantine (see the module docstring)."""
    try:
        st = os.stat(name, dir_fd=qfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if name.endswith(LINK_SUFFIX):
        return st if is_quarantined_link_name(name) and stat.S_ISLNK(st.st_mode) else None
    if not _BLOCK_NAME.fullmatch(name) or not stat.S_ISREG(st.st_mode):
        return None
    if st.st_uid != os.geteuid() or st.st_nlink != 1:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=qfd)
    except OSError:
        return None
    try:
        head = os.pread(fd, len(MAGIC), 0)
    finally:
        os.close(fd)
    return st if head == MAGIC or len(head) < len(MAGIC) else None

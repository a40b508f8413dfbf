"""The block store's limits: its capacity bound, the permission bits of its files, and the causes
of failed writes (logged once per cause, counted always).

Capacity: by default a store may hold ``AUTO_SHARE`` of the space free on its file system when it
opens, plus the blocks already there, capped by an operator's limit (``--kv-capacity-gb``). The
share left over (10% of the free space at open) is the floor that triggers eviction when something
else fills the disk. Permissions: block files are ``0600`` and directories ``0700`` by default
(token ids are stored in clear); a shared file system used by one group may take ``0640`` (the
directories then get ``0750``).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
from pathlib import Path

from dualpath.core.errors import ConfigError

log = logging.getLogger("dualpath.runtime.kvstore")

AUTO_SHARE = 0.9  # of the free space at open
DEFAULT_FILE_MODE = 0o600
_ALLOWED_MODE_BITS = 0o660  # owner rw (required) + group rw; never world, never exec


def check_file_mode(mode: int) -> int:
    """``mode`` if it is a valid block-file mode: owner read+write, optionally group read/write,
    nothing for others (ConfigError naming the value otherwise)."""
    if not isinstance(mode, int) or isinstance(mode, bool):
        raise ConfigError("kv_file_mode", mode, "must be an octal mode such as 0600 or 0640")
    if mode & ~_ALLOWED_MODE_BITS or mode & 0o600 != 0o600:
        raise ConfigError(
            "kv_file_mode",
            oct(mode),
            "must give the owner read+write and others nothing (0600, 0640 or 0660); no execute bits",
        )
    return mode


def parse_file_mode(text: str) -> int:
    """An octal mode string ("0640", "640", "0o640") as an int, validated (ConfigError naming it)."""
    raw = text.strip().lower().removeprefix("0o")
    try:
        mode = int(raw, 8)
    except ValueError:
        raise ConfigError("kv_file_mode", text, "must be an octal mode such as 0600 or 0640") from None
    try:
        return check_file_mode(mode)
    except ConfigError as err:
        raise ConfigError("kv_file_mode", text, err.reason) from None


def dir_mode_for(file_mode: int) -> int:
    """Directory bits for ``file_mode``: each class that may read files may also list and enter."""
    mode = file_mode | 0o100
    if file_mode & 0o040:
        mode |= 0o010
    return mode


def block_bytes_in(root: Path) -> int:
    """Bytes of the block files (``??/*.kvb``) already under ``root`` (0 if it does not exist)."""
    total = 0
    if not root.is_dir():
        return 0
    for sub in os.scandir(root):  # links are not followed: they are not the store's
        if len(sub.name) != 2 or not sub.is_dir(follow_symlinks=False):
            continue
        for entry in os.scandir(sub.path):
            if entry.name.endswith(".kvb") and entry.is_file(follow_symlinks=False):
                try:
                    total += entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    pass
    return total


def free_bytes(root: Path) -> int:
    """Bytes free (for this user) on the file system holding ``root`` or its nearest ancestor."""
    path = root.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def auto_capacity_bytes(root: str | Path, limit_bytes: int | None = None, share: float = AUTO_SHARE) -> int:
    """The default capacity of a store on ``root``: the blocks already there plus ``share`` of the
    free space now, capped by ``limit_bytes`` (an operator's ``--kv-capacity-gb``) when given."""
    root = Path(root)
    auto = block_bytes_in(root) + int(share * free_bytes(root))
    return auto if limit_bytes is None else min(auto, limit_bytes)


def capacity_from_gb(kv_capacity_gb: float | None, root: str | Path) -> int:
    """Capacity for ``--kv-capacity-gb`` (None or 0: the automatic share of the free space)."""
    if kv_capacity_gb is not None and kv_capacity_gb < 0:
        raise ConfigError(
            "kv_capacity_gb",
            kv_capacity_gb,
            f"must be > 0 (0 or omitted: {AUTO_SHARE:.0%} of the free space at start)",
        )
    limit = int(kv_capacity_gb * 1e9) if kv_capacity_gb else None
    return auto_capacity_bytes(root, limit)


def cause_of(err: OSError) -> str:
    """A short stable label for a failed write: the errno name ("ENOSPC", "EACCES", ...)."""
    if err.errno is None:
        return type(err).__name__
    return errno.errorcode.get(err.errno, f"errno{err.errno}")


class WriteErrors:
    """Counts failed writes by cause; logs the first of each cause (a full disk would otherwise
    log one line per block). Thread-safe."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def record(self, err: OSError, block_hash: str) -> str:
        cause = cause_of(err)
        with self._lock:
            first = cause not in self.counts
            self.counts[cause] = self.counts.get(cause, 0) + 1
        if first:
            log.warning(
                "kvstore %s: writing block %s failed (%s: %s); the block is not cached, "
                "requests go on (recompute). Further %s failures are only counted "
                "(dualpath_store_write_errors_total{cause=%r})",
                self.root,
                block_hash,
                cause,
                err.strerror or err,
                cause,
                cause,
            )
        return cause

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

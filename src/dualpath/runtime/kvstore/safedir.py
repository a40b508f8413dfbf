"""The block store's directory, reached only through directory file descriptors, never a link.

The root (the operator's ``--kv-dir``; links in that path are followed once, at open) is held open
as a directory fd. Everything under it is reached relative to a directory fd (``os.open(name,
..., dir_fd=)``, ``os.rename(..., src_dir_fd=, dst_dir_fd=)``, ``os.stat(..., follow_symlinks=False)``)
with ``O_NOFOLLOW``: a shard directory (``ab/``), ``quarantine/``, ``kvstore.json`` or a block file
that is a symlink is refused. A refusal is counted (``links_refused``; exported as
``dualpath_store_refused_links_total``), logged once per store, and the link itself is moved by
rename into ``quarantine/`` as ``<where>.<pid>.<ns>.link`` (its target is never opened, statted or
changed); a fresh directory then takes a refused directory's place.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("dualpath.runtime.kvstore")

QUARANTINE_DIR = "quarantine"
LINK_SUFFIX = ".link"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_LINK_NAME = re.compile(r"[0-9a-z_]+\.\d+\.\d+" + re.escape(LINK_SUFFIX))


def is_quarantined_link_name(name: str) -> bool:
    """Whether ``name`` is one the store gives a link it moved into quarantine."""
    return _LINK_NAME.fullmatch(name) is not None


class StoreDir:
    """The root directory fd plus the link-refusing operations every store function uses.

    Thread-safe; one per ``BlockStore``. ``close()`` (or garbage collection) closes the root fd.
    """

    def __init__(self, root: Path, dir_mode: int) -> None:
        root.mkdir(parents=True, exist_ok=True, mode=dir_mode)
        self.root = root
        self.dir_mode = dir_mode
        self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._close = weakref.finalize(self, os.close, self.fd)
        self._lock = threading.Lock()
        self.links_refused = 0
        self._warned = False

    def close(self) -> None:
        self._close()

    # ----- directories -------------------------------------------------------------------------
    def open_dir(self, name: str, create: bool) -> int | None:
        """An fd of the directory ``name`` right under the root (the caller closes it); None if
        it is absent (and not ``create``) or not a directory. A link there is refused, and with
        ``create`` a fresh directory takes its place."""
        for _ in range(4):  # a concurrent process may be replacing the same entry
            try:
                return os.open(name, _DIR_FLAGS, dir_fd=self.fd)
            except FileNotFoundError:
                if not create:
                    return None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, self.dir_mode, dir_fd=self.fd)
            except NotADirectoryError:  # a link (O_NOFOLLOW | O_DIRECTORY) or a plain file
                if not self.is_link(self.fd, name):
                    return None
                self.refuse(self.fd, name, name)
                if not create:
                    return None
        raise OSError(errno.ELOOP, f"{self.root}/{name} keeps being replaced by a link")

    @contextlib.contextmanager
    def dir(self, name: str, create: bool = False) -> Iterator[int | None]:
        """``open_dir`` as a context manager that closes the fd."""
        fd = self.open_dir(name, create)
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    def quarantine_fd(self) -> int:
        """An fd of ``quarantine/`` (made if absent; a link there is replaced). Caller closes."""
        fd = self.open_dir(QUARANTINE_DIR, create=True)
        if fd is None:
            raise NotADirectoryError(errno.ENOTDIR, f"{self.root}/{QUARANTINE_DIR} is not a directory")
        return fd

    # ----- files -------------------------------------------------------------------------------
    def open_file(self, dir_fd: int, name: str, flags: int, mode: int = 0o600, where: str = "") -> int | None:
        """``os.open(name, flags | O_NOFOLLOW, dir_fd=dir_fd)``; None if it is absent (without
        ``O_CREAT``) or a link (refused). Other errors raise."""
        try:
            return os.open(name, flags | NOFOLLOW, mode, dir_fd=dir_fd)
        except FileNotFoundError:
            if flags & os.O_CREAT:
                raise
            return None
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise
            self.refuse(dir_fd, name, where or name)
            return None

    @staticmethod
    def is_link(dir_fd: int, name: str) -> bool:
        try:
            return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return False

    @staticmethod
    def is_file(dir_fd: int, name: str) -> bool:
        """Whether ``name`` is a regular file (a link is not, whatever it points to)."""
        try:
            return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    # ----- refusals ----------------------------------------------------------------------------
    def refuse(self, dir_fd: int, name: str, where: str) -> None:
        """Move the link ``name`` (in ``dir_fd``) into quarantine, if it still is a link; count
        it and log the first of this store's refusals."""
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:  # gone, or no longer a link: someone else dealt with it
            return
        label = where.replace("/", "_").replace(".", "_")
        dest = f"{label}.{os.getpid()}.{time.time_ns()}{LINK_SUFFIX}"
        with contextlib.suppress(FileNotFoundError):
            self._move_into_quarantine(dir_fd, name, dest)
        with self._lock:
            self.links_refused += 1
            first, self._warned = not self._warned, True
        if first:
            log.warning(
                "kvstore %s: refused a symlink at %s (-> %s): the store never follows links; "
                "moved the link to %s/%s. Further refusals are only counted "
                "(dualpath_store_refused_links_total)",
                self.root, where, target, QUARANTINE_DIR, dest,
            )  # fmt: skip

    def _move_into_quarantine(self, dir_fd: int, name: str, dest: str) -> None:
        if dir_fd == self.fd and name == QUARANTINE_DIR:  # the link is quarantine itself
            aside = f".tmp.qlink.{os.getpid()}.{time.time_ns()}"
            os.rename(name, aside, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            with contextlib.suppress(FileExistsError):
                os.mkdir(QUARANTINE_DIR, self.dir_mode, dir_fd=self.fd)
            dir_fd, name = self.fd, aside
            qfd = os.open(QUARANTINE_DIR, _DIR_FLAGS, dir_fd=self.fd)
        else:
            qfd = self.quarantine_fd()
        try:
            os.rename(name, dest, src_dir_fd=dir_fd, dst_dir_fd=qfd)
        finally:
            os.close(qfd)

    # ----- permissions -------------------------------------------------------------------------
    @staticmethod
    def chmod_own(fd: int, mode: int) -> None:
        """Set the bits of the file or directory open as ``fd`` if they differ, it is ours, and
        (for a file) it has one name only: a hard link's other name may be someone else's file."""
        st = os.fstat(fd)
        if st.st_mode & 0o7777 == mode or st.st_uid != os.geteuid():
            return
        if stat.S_ISREG(st.st_mode) and st.st_nlink != 1:
            return
        with contextlib.suppress(PermissionError):
            os.fchmod(fd, mode)

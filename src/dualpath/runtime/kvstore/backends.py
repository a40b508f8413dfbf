"""Open a storage backend by name (``--kv-backend``): posix (default), nixl-posix, mooncake.

The optional ones need their packages (extras ``dualpath[nixl]``, ``dualpath[mooncake]``); without
them the error names what to install (``missing`` says so without opening anything).
"""

from __future__ import annotations

from pathlib import Path

from dualpath.core.errors import ConfigError, UnknownNameError
from dualpath.runtime.kvstore.backend import BACKEND_NAMES, BlockBackend
from dualpath.runtime.kvstore.layout import BlockLayout
from dualpath.runtime.kvstore.mooncake_backend import MooncakeSpec
from dualpath.runtime.kvstore.posix_backend import PosixBackend

__all__ = ["BACKEND_NAMES", "MooncakeSpec", "check_available", "missing", "open_backend"]


def open_backend(
    name: str,
    root: str | Path,
    layout: BlockLayout,
    *,
    file_mode: int = 0o600,
    fsync: bool = False,
    direct_io: bool = False,
    mooncake: MooncakeSpec | None = None,
) -> BlockBackend:
    """Backend ``name`` for ``layout``: the directory ``root`` (posix, nixl-posix) or the Mooncake
    Store at ``mooncake`` (required for mooncake; ConfigError naming what is missing)."""
    if name == "posix":
        return PosixBackend(root, layout, file_mode=file_mode, fsync=fsync, direct_io=direct_io)
    if name == "nixl-posix":
        from dualpath.runtime.kvstore.nixl_backend import NixlPosixBackend

        return NixlPosixBackend(root, layout, file_mode=file_mode, fsync=fsync, direct_io=direct_io)
    if name == "mooncake":
        if mooncake is None:
            raise ConfigError(
                "kv_backend", name, "needs a master (--mooncake-master and --mooncake-metadata)"
            )
        from dualpath.runtime.kvstore.mooncake_backend import MooncakeBackend

        return MooncakeBackend(layout, mooncake)
    raise UnknownNameError("kv_backend", name, BACKEND_NAMES)


def check_available(name: str) -> None:
    """ConfigError naming what is missing when backend ``name`` cannot be opened here."""
    if name not in BACKEND_NAMES:
        raise UnknownNameError("kv_backend", name, BACKEND_NAMES)
    if name == "nixl-posix":
        from dualpath.runtime.kvstore.nixl_backend import NixlFileIO

        NixlFileIO()  # imports NIXL and makes an agent with the POSIX plugin
    elif name == "mooncake":
        from dualpath.runtime.kvstore.mooncake_backend import import_store
        from dualpath.runtime.kvstore.mooncake_service import binary

        import_store()
        binary("mooncake_master")


def missing(name: str) -> str | None:
    """Why backend ``name`` cannot be opened here (its package does not import); None: it can."""
    try:
        check_available(name)
    except ConfigError as exc:
        return str(exc)
    return None

"""Pick a cross-process transport by name: "zmq" (default), "shm", "mooncake", "nixl".

``zmq`` sends payloads as ZeroMQ frames (``tcp://``, across hosts); ``shm`` through shared-memory
rings (one host); ``mooncake`` and ``nixl`` by a one-sided transfer engine (Mooncake's transfer
engine, NIXL with UCX: ``onesided.py``), with the same ZeroMQ channel for headers, control
messages and acks. The engines are optional packages (extras ``dualpath[mooncake]``,
``dualpath[nixl]``); without them the error names what to install.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dualpath.core.errors import UnknownNameError
from dualpath.runtime.choices import TRANSPORT_NAMES
from dualpath.runtime.transfer.base import Transport

__all__ = ["TRANSPORT_NAMES", "make_transport"]


def make_transport(
    name: str, *, host: str = "127.0.0.1", limiter: Callable[[int], object] | None = None, keys: Any = None
) -> Transport:
    """A new transport; ``limiter(nbytes)`` (the engine's CNIC) is called before each batch;
    ``keys`` (``auth.ClusterKeys``): CURVE-authenticated ZeroMQ sockets (None: plain). ``host``:
    where peers reach it (the ZeroMQ socket; Mooncake's engine too). A missing engine package
    raises ConfigError naming it."""
    if name == "zmq":
        from dualpath.runtime.transfer.zmq_transport import ZmqTransport

        return ZmqTransport(host=host, limiter=limiter, keys=keys)
    if name == "shm":
        from dualpath.runtime.transfer.shm_transport import ShmTransport

        return ShmTransport(limiter=limiter, keys=keys)
    if name == "mooncake":
        from dualpath.runtime.transfer.mooncake import mooncake_transport

        return mooncake_transport(host=host, limiter=limiter, keys=keys)
    if name == "nixl":
        from dualpath.runtime.transfer.nixl import nixl_transport

        return nixl_transport(host=host, limiter=limiter, keys=keys)
    raise UnknownNameError("transport", name, TRANSPORT_NAMES)


def missing(name: str) -> str | None:
    """Why transport ``name`` cannot be made here (its engine package does not import); None: it can."""
    from dualpath.core.errors import ConfigError

    try:
        if name == "mooncake":
            from dualpath.runtime.transfer.mooncake import import_engine

            import_engine()
        elif name == "nixl":
            from dualpath.runtime.transfer.nixl import import_api

            import_api()
    except ConfigError as exc:
        return str(exc)
    return None

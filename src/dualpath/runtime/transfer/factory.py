"""Pick a cross-process transport by name: "zmq" (default), "shm", "mooncake", "nixl".

Mooncake's transfer engine and NIXL are optional RDMA-capable engines; they are selected only when
their Python packages import, otherwise the error says what to install. Their adapters are not
implemented in this tree yet: when installed they fail with a clear message rather than silently
falling back.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from dualpath.core.errors import ConfigError, UnknownNameError
from dualpath.runtime.choices import TRANSPORT_NAMES
from dualpath.runtime.transfer.base import Transport

__all__ = ["TRANSPORT_NAMES", "make_transport"]
_OPTIONAL = {
    "mooncake": ("mooncake", "pip install mooncake-transfer-engine"),
    "nixl": ("nixl", "pip install nixl"),
}


def make_transport(
    name: str, *, host: str = "127.0.0.1", limiter: Callable[[int], object] | None = None, keys: Any = None
) -> Transport:
    """A new transport; ``limiter(nbytes)`` (the engine's CNIC) is called before each batch;
    ``keys`` (``auth.ClusterKeys``): CURVE-authenticated sockets (None: plain)."""
    if name == "zmq":
        from dualpath.runtime.transfer.zmq_transport import ZmqTransport

        return ZmqTransport(host=host, limiter=limiter, keys=keys)
    if name == "shm":
        from dualpath.runtime.transfer.shm_transport import ShmTransport

        return ShmTransport(limiter=limiter, keys=keys)
    if name in _OPTIONAL:
        module, install = _OPTIONAL[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError("transport", name, f"module {module!r} is not installed ({install})")
        raise ConfigError(
            "transport", name, f"{module} is installed but dualpath has no adapter for it yet; use zmq or shm"
        )
    raise UnknownNameError("transport", name, TRANSPORT_NAMES)

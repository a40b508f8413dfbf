"""KV transport over Mooncake's transfer engine (``--transport mooncake``).

A :class:`~dualpath.runtime.transfer.onesided.OneSidedTransport` whose engine is Mooncake's
``TransferEngine`` (package ``mooncake-transfer-engine-non-cuda``, extra ``dualpath[mooncake]``;
its ``mooncake/engine.so`` links ``libibverbs.so.1``, Debian's ``libibverbs1``, even for TCP).
Each transport starts one engine with P2P handshake metadata (no etcd: peers fetch each other's
segment descriptors from the engine's own RPC port) and the protocol ``DUALPATH_MOONCAKE_PROTOCOL`` names
(``tcp`` unless set; ``rdma`` on a fabric with RDMA NICs). Its peer name is the session id
``host:rpc_port``. A receiver reads a message's slots with one ``batch_transfer_async_read``
(``get_batch_transfer_status`` waits for it: Mooncake's own timeouts bound it; a failed batch
raises ``UnsettledRead``, since its status does not say whether a timed-out task still writes, so
its landing range is never reused: ``regions.py``); the
sender's engine serves only ranges inside buffers it registered (it refuses others: "not within
any registered buffer") and authenticates nobody (docs/server.md). Mooncake's logging is set to
``MC_LOG_LEVEL=ERROR`` unless the environment says otherwise.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

from dualpath.core.errors import ConfigError
from dualpath.runtime.transfer.base import TransferError
from dualpath.runtime.transfer.onesided import RING_BYTES, OneSidedTransport, Span
from dualpath.runtime.transfer.regions import UnsettledRead

INSTALL = "pip install 'dualpath[mooncake]' and apt-get install libibverbs1"
_SESSION = re.compile(r"^[A-Za-z0-9.\-\[\]:]{1,253}:[0-9]{1,5}$")


def import_engine() -> Any:
    """Mooncake's ``TransferEngine`` class; ConfigError naming the missing piece otherwise."""
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    try:
        from mooncake.engine import TransferEngine
    except ImportError as exc:  # no package, or no libibverbs.so.1 for its engine.so
        raise ConfigError(
            "transport", "mooncake", f"cannot import mooncake.engine: {exc} ({INSTALL})"
        ) from None
    return TransferEngine


class MooncakeEngine:
    """One Mooncake ``TransferEngine`` as ``onesided.Engine``."""

    kind = "mooncake"

    def __init__(self, host: str = "127.0.0.1", protocol: str | None = None) -> None:
        self.protocol = protocol or os.environ.get("DUALPATH_MOONCAKE_PROTOCOL", "tcp")
        self._te = import_engine()()
        rc = self._te.initialize(host, "P2PHANDSHAKE", self.protocol, "")
        if rc != 0:
            raise ConfigError(
                "transport", "mooncake", f"TransferEngine.initialize({host!r}, {self.protocol!r}) -> {rc}"
            )
        self.segment = f"{host}:{self._te.get_rpc_port()}"
        self.peer_info = b""
        self._registered: list[int] = []
        self._lock = threading.Lock()

    def register(self, addr: int, nbytes: int) -> None:
        rc = self._te.register_memory(addr, nbytes)
        if rc != 0:
            raise TransferError(f"mooncake register_memory of {nbytes} bytes -> {rc}")
        self._registered.append(addr)

    def check_peer(self, segment: str, peer: bytes) -> str | None:
        if not _SESSION.match(segment) or peer:
            return f"segment {segment!r} is not a Mooncake session id (host:port)"
        return None

    def post(self, segment: str, peer: bytes, spans: Sequence[Span]) -> tuple[int, str, int]:
        if not spans:
            return (0, segment, 0)
        local, remote, lengths = ([s[i] for s in spans] for i in range(3))
        batch = self._te.batch_transfer_async_read(segment, local, remote, lengths)
        if batch <= 0:
            raise TransferError(f"mooncake read of {sum(lengths)} bytes from {segment} not started ({batch})")
        return (batch, segment, sum(lengths))

    def wait(self, token: tuple[int, str, int]) -> None:
        batch, segment, nbytes = token
        if batch and (rc := self._te.get_batch_transfer_status([batch])) != 0:
            # its status code does not say whether a timed-out task's bytes still move: never reuse
            raise UnsettledRead(f"mooncake read of {nbytes} bytes from {segment} failed ({rc})")

    def close(self) -> None:
        with self._lock:
            for addr in self._registered:
                self._te.unregister_memory(addr)
            self._registered.clear()


def mooncake_transport(
    *,
    host: str = "127.0.0.1",
    limiter: Callable[[int], object] | None = None,
    keys: Any = None,
    ring_bytes: int = RING_BYTES,
) -> OneSidedTransport:
    """A transport whose payloads move by Mooncake's transfer engine (see the module docstring)."""
    return OneSidedTransport(
        MooncakeEngine(host), host=host, ring_bytes=ring_bytes, limiter=limiter, keys=keys
    )

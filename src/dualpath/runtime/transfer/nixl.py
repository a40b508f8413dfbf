"""KV transport over NIXL (``--transport nixl``).

A :class:`~dualpath.runtime.transfer.onesided.OneSidedTransport` whose engine is one NIXL agent
with the UCX backend (package ``nixl-cu12``, imported as ``nixl`` or ``nixl_cu12``; extra
``dualpath[nixl]``, installed after torch, or ``pip install --no-deps nixl-cu12`` so that it
cannot pull a CUDA torch). UCX picks its transports from ``UCX_TLS`` (all it finds unless set:
``tcp`` between hosts, ``cma``, cross-memory attach, between processes of one host; RDMA verbs
on a fabric that has them) and its network devices from ``UCX_NET_DEVICES`` (``lo`` when ``host``
is a loopback address and the variable is unset, so a local cluster listens on loopback only, as
its ZeroMQ sockets do; on other hosts, name the cluster's interface). The agent's metadata (its
UCX worker address and registrations) is not published anywhere: it travels in each slot
message's ``DataMsg.peer`` on the (CURVE-authenticated when keyed) ZeroMQ channel, and the
receiver loads it once per peer (``add_remote_agent``; at most ``MAX_PEERS``, least recently used
dropped). A receiver reads a message's slots with one READ request (started on the receive
thread, polled to completion on the delivery thread: calls into the agent hold one lock),
(``POLL_SPIN_S``, ``POLL_MAX_S``) within ``READ_TIMEOUT_S``; NIXL refuses a read outside the
peer's registered memory when it builds the request. A read NIXL could not cancel
(``release_xfer_handle`` failed after a timeout or error) raises ``UnsettledRead``: its landing
range is never reused (``regions.py``). NIXL's Python logging is set to
``NIXL_LOG_LEVEL=WARN`` unless the environment says otherwise (it logs to stdout). On a host
without RDMA devices UCX's ib and rdmacm modules are not loaded (``UCX_MODULES=^ib,rdmacm``
unless set): with them, every process that made a UCX backend segfaults at exit, in the wheel's
bundled ``libnl-route-3`` (``rtnl_tc_unregister`` from ``_dl_fini``; nixl-cu12 1.5.1).
"""

from __future__ import annotations

import importlib
import ipaddress
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from dualpath.core.errors import ConfigError
from dualpath.runtime.transfer.base import TransferError
from dualpath.runtime.transfer.onesided import RING_BYTES, OneSidedTransport, Span
from dualpath.runtime.transfer.regions import UnsettledRead

INSTALL = "pip install --no-deps nixl-cu12==1.5.1 after torch (or 'dualpath[nixl]')"
MODULES = ("nixl._api", "nixl_cu12._api", "nixl_cu13._api")  # the meta package, then the builds
MAX_PEERS = 256  # remote agents kept loaded (as the ZeroMQ receiver's ack sockets)
READ_TIMEOUT_S = 30.0  # one message's READ (as the send ring's wait for space)
POLL_SPIN_S = 2e-3  # the completion poll only yields the GIL this long (a 768 KiB read: ~0.2-1 ms)
POLL_MAX_S = 0.5e-3  # then it backs off from 10 us to this between polls
_NAME = re.compile(r"^dualpath-[0-9a-f]{16}$")
log = logging.getLogger("dualpath.transfer.nixl")


def import_api() -> Any:
    """NIXL's ``_api`` module; ConfigError naming what is missing otherwise."""
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    if not _rdma_devices():  # UCX's ib modules pull the wheel's libnl-route, which crashes at exit
        os.environ.setdefault("UCX_MODULES", "^ib,rdmacm")
    errors = []
    for name in MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise ConfigError("transport", "nixl", f"cannot import NIXL ({'; '.join(errors)}); {INSTALL}")


def _rdma_devices() -> bool:
    """Whether the host has RDMA devices (``/sys/class/infiniband`` lists any)."""
    try:
        return any(os.scandir("/sys/class/infiniband"))
    except OSError:
        return False


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


class NixlEngine:
    """One NIXL agent (UCX backend) as ``onesided.Engine``."""

    kind = "nixl"

    def __init__(self, host: str = "127.0.0.1") -> None:
        if _loopback(host):
            os.environ.setdefault("UCX_NET_DEVICES", "lo")  # listen on loopback only, as the ZeroMQ socket
        api = import_api()
        self.segment = f"dualpath-{uuid.uuid4().hex[:16]}"
        self._agent = api.nixl_agent(self.segment, api.nixl_agent_config(backends=["UCX"]))
        if "UCX" not in self._agent.backends:
            raise ConfigError(
                "transport", "nixl", f"NIXL has no UCX backend (plugins: {self._agent.plugin_list})"
            )
        self._regs: list[Any] = []
        self._peers: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()  # the agent runs with NIXL's thread sync off: one caller at a time
        self.peer_info = b""

    def register(self, addr: int, nbytes: int) -> None:
        self._regs.append(self._agent.register_memory([(addr, nbytes, 0, "")], "DRAM"))
        self.peer_info = self._agent.get_agent_metadata()  # now naming every registration

    def check_peer(self, segment: str, peer: bytes) -> str | None:
        if not _NAME.match(segment) or not peer:
            return f"segment {segment!r} is not a dualpath NIXL agent with its metadata"
        return None

    def _load(self, name: str, meta: bytes) -> None:
        if self._peers.get(name) == meta:
            self._peers.move_to_end(name)
            return
        if name in self._peers:  # the peer registered again: its metadata changed
            self._agent.remove_remote_agent(name)
            del self._peers[name]
        loaded = self._agent.add_remote_agent(meta)
        loaded = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
        if loaded != name:
            self._agent.remove_remote_agent(loaded)
            raise TransferError(f"NIXL metadata names agent {loaded!r}, the message {name!r}")
        self._peers[name] = meta
        while len(self._peers) > MAX_PEERS:
            self._agent.remove_remote_agent(self._peers.popitem(last=False)[0])

    def post(self, segment: str, peer: bytes, spans: Sequence[Span]) -> Any:
        if not spans:
            return None
        try:
            with self._lock:
                self._load(segment, peer)
                local = self._agent.get_xfer_descs([(s[0], s[2], 0) for s in spans], "DRAM")
                remote = self._agent.get_xfer_descs([(s[1], s[2], 0) for s in spans], "DRAM")
                handle = self._agent.initialize_xfer("READ", local, remote, segment)
        except TransferError:
            raise
        except Exception as exc:  # NIXL's errors (e.g. NIXL_ERR_NOT_FOUND: outside its registrations)
            raise TransferError(f"NIXL read from {segment} refused: {type(exc).__name__}: {exc}") from None
        with self._lock:
            state = self._agent.transfer(handle)
        return (handle, segment, state, time.monotonic())

    def wait(self, token: Any) -> None:
        if token is None:
            return
        handle, segment, state, start = token
        error: BaseException | None = None
        try:
            self._complete(handle, segment, state, start)
        except BaseException as exc:
            error = exc
        try:
            with self._lock:  # cancels a read still in flight (a timeout)
                self._agent.release_xfer_handle(handle)
        except Exception as exc:  # noqa: BLE001 - NIXL could not cancel it: its bytes may still land
            log.warning("NIXL could not release a read from %s: %s", segment, exc)
            if error is not None:
                raise UnsettledRead(f"{error}; NIXL could not cancel it ({exc})") from error
        if error is not None:
            raise error

    def _complete(self, handle: Any, segment: str, state: str, start: float) -> None:
        wait = 0.0
        while state == "PROC":
            now = time.monotonic()
            if now - start > READ_TIMEOUT_S:
                raise TransferError(f"NIXL read from {segment} took over {READ_TIMEOUT_S} s")
            if now - start > POLL_SPIN_S:  # a long read: back off, up to POLL_MAX_S between polls
                wait = min(max(2 * wait, 10e-6), POLL_MAX_S)
            if wait:
                time.sleep(wait)
            else:  # yield the GIL and the CPU without a timer (sleep(0) costs the timer slack, >= 50 us)
                os.sched_yield()
            with self._lock:
                state = self._agent.check_xfer_state(handle)
        if state != "DONE":
            raise TransferError(f"NIXL read from {segment} failed ({state})")

    def close(self) -> None:
        for name in list(self._peers):
            self._agent.remove_remote_agent(name)
        self._peers.clear()
        for reg in self._regs:
            self._agent.deregister_memory(reg)
        self._regs.clear()


def nixl_transport(
    *,
    host: str = "127.0.0.1",
    limiter: Callable[[int], object] | None = None,
    keys: Any = None,
    ring_bytes: int = RING_BYTES,
) -> OneSidedTransport:
    """A transport whose payloads move by NIXL (see the module docstring)."""
    return OneSidedTransport(NixlEngine(host), host=host, ring_bytes=ring_bytes, limiter=limiter, keys=keys)

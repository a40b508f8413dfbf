"""ZeroMQ transport between engine processes (``tcp://`` across hosts, ``ipc://`` on one host).

Implements :class:`~dualpath.runtime.transfer.base.Transport`. Every transport binds one PULL socket
(its ``address``). A send thread drains a FIFO of submits (so items to one destination arrive in
submit order), optionally waits on an emulated NIC (``limiter(nbytes)``, the traffic manager's CNIC),
and sends one multipart message per submit: a msgspec header naming the items plus one frame per
payload (zero-copy); a ``notify`` sends one ``CtlMsg`` whose header holds the typed control
messages (``transfer/control.py``), in the same FIFO. A receive thread delivers the items (or the
control messages) into the sink bound to the destination endpoint and sends an ack back; the sender's handle completes on the ack, so a completed handle
means the payload sits in the destination sink. Endpoint names map to transport addresses through
``add_route`` (the cluster fills the table from the scheduler's peer list).

The wire format is ``zmq_wire.py``; the receive thread, and why nothing received can stop it,
``zmq_recv.py``.
"""

from __future__ import annotations

import os
import queue
import tempfile
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from dualpath.core.errors import ConfigError
from dualpath.runtime.transfer.auth import ClusterKeys, Gatekeeper
from dualpath.runtime.transfer.base import (
    KVSink,
    TransferError,
    TransferHandle,
    TransferItem,
    Transport,
)
from dualpath.runtime.transfer.control import MAX_CONTROLS, Control
from dualpath.runtime.transfer.drops import DropCounter
from dualpath.runtime.transfer.zmq_recv import ZmqReceiver
from dualpath.runtime.transfer.zmq_wire import ENCODER, CtlMsg, DataMsg, ItemMeta, payload_view

_Job = tuple[int, str, str, Sequence[Any], bool]  # seq, dest, source, items or controls, control?


class ZmqTransport(ZmqReceiver, Transport):
    """See the module docstring. ``scheme`` "tcp" binds ``tcp://host:*``, "ipc" a socket file."""

    kind = "zmq"
    _peer_info = b""  # sent with each message whose slots name a segment (``DataMsg.peer``)

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        scheme: str = "tcp",
        limiter: Callable[[int], object] | None = None,
        drops: DropCounter | None = None,
        keys: ClusterKeys | None = None,
    ) -> None:
        if scheme not in ("tcp", "ipc"):
            raise ConfigError("scheme", scheme, "choices: tcp, ipc")
        self.drops = drops or DropCounter("transport")
        self.keys = keys
        self.ctx = zmq.Context()
        self._gate = Gatekeeper(self.ctx, keys) if keys is not None else None
        self._pull = self.ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        if keys is not None:
            keys.server(self._pull)
        self._monitor = self._gate.monitor(self._pull) if self._gate is not None else None
        if scheme == "tcp":
            self._pull.bind(f"tcp://{host}:*")
        else:
            path = os.path.join(tempfile.gettempdir(), f"dualpath-{uuid.uuid4().hex[:12]}.ipc")
            self._pull.bind(f"ipc://{path}")
        self.address: str = self._pull.getsockopt_string(zmq.LAST_ENDPOINT)
        self.limiter = limiter
        self._sinks: dict[str, KVSink] = {}
        self._routes: dict[str, str] = {}
        self._pending: dict[int, tuple[TransferHandle, str, list[Any]]] = {}
        self._lock = threading.Lock()
        self._seq = 0
        self._completed = 0
        self._closed = False
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._ctl_addr = f"inproc://ctl-{uuid.uuid4().hex}"
        self._ctl = self.ctx.socket(zmq.PULL)
        self._ctl.bind(self._ctl_addr)
        self._send_thread = threading.Thread(target=self._send_loop, name="zmq-send", daemon=True)
        self._recv_thread = threading.Thread(target=self._recv_loop, name="zmq-recv", daemon=True)
        self._send_thread.start()
        self._recv_thread.start()

    # ------------------------------------------------------------------ public API
    def bind(self, endpoint: str, sink: KVSink) -> None:
        with self._lock:
            if endpoint in self._sinks:
                raise TransferError(f"endpoint {endpoint!r} is already bound")
            self._sinks[endpoint] = sink
            self._routes[endpoint] = self.address

    def add_route(self, endpoint: str, address: str) -> None:
        """Endpoint ``endpoint`` lives on the transport at ``address``."""
        with self._lock:
            self._routes[endpoint] = address

    def routes(self) -> dict[str, str]:
        with self._lock:
            return dict(self._routes)

    def submit(
        self,
        dest: str,
        items: Sequence[TransferItem],
        *,
        source: str = "",
        callback: Callable[[TransferHandle], None] | None = None,
    ) -> TransferHandle:
        handle = TransferHandle(len(items), sum(i.nbytes for i in items), callback)
        return self._queue_job(dest, source, items, handle)

    def notify(
        self,
        dest: str,
        msgs: Sequence[Control],
        *,
        source: str = "",
        callback: Callable[[TransferHandle], None] | None = None,
    ) -> TransferHandle:
        if not 1 <= len(msgs) <= MAX_CONTROLS:
            raise TransferError(f"{len(msgs)} control messages; one submit takes 1 to {MAX_CONTROLS}")
        return self._queue_job(dest, source, list(msgs), TransferHandle(len(msgs), 0, callback), True)

    def _queue_job(
        self, dest: str, source: str, what: Sequence[Any], handle: TransferHandle, control: bool = False
    ) -> TransferHandle:
        with self._lock:
            if self._closed:
                raise TransferError("transport is closed")
            if dest not in self._routes:
                known = ", ".join(sorted(self._routes)) or "none"
                raise TransferError(f"unknown endpoint {dest!r}; routes: {known}")
            self._seq += 1
            seq = self._seq
            self._pending[seq] = (handle, dest, [])
        self._jobs.put((seq, dest, source, what, control))
        return handle

    def fail_endpoint(self, endpoint: str, reason: str) -> int:
        """Fail every outstanding transfer to ``endpoint`` (its process died); returns how many."""
        with self._lock:
            seqs = [s for s, (_, d, _) in self._pending.items() if d == endpoint]
        for s in seqs:
            self._finish(s, reason)
        return len(seqs)

    def poll(self) -> int:
        with self._lock:
            done, self._completed = self._completed, 0
        return done

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._pending)
        self._jobs.put(None)
        self._send_thread.join(5)
        for s in pending:
            self._finish(s, "transport closed")
        self._stop_recv()

    # ------------------------------------------------------------------ internals
    def _finish(self, seq: int, error: str | None) -> None:
        with self._lock:
            entry = self._pending.pop(seq, None)
            if entry is not None:
                self._completed += 1
        if entry is None:
            return
        self._release(entry[2])
        entry[0].complete(TransferError(error) if error else None)

    def _release(self, resources: list[Any]) -> None:
        """Free per-transfer resources (shared-memory ranges in the shm transport)."""

    def _pack(
        self, dest_addr: str, items: Sequence[TransferItem], resources: list[Any]
    ) -> tuple[list[ItemMeta], list[memoryview], str]:
        metas, frames = [], []
        for it in items:
            view = payload_view(it.payload)
            metas.append(
                ItemMeta(it.key, it.block_index, it.layer, it.num_tokens, it.token_offset, view.nbytes)
            )
            frames.append(view)
        return metas, frames, ""

    def _unpack(self, msg: DataMsg, frames: list[zmq.Frame]) -> list[TransferItem]:
        return [
            TransferItem(
                key=m.key,
                block_index=m.block_index,
                layer=m.layer,
                num_tokens=m.num_tokens,
                token_offset=m.token_offset,
                payload=frames[i + 1].buffer,
            )
            for i, m in enumerate(msg.items)
        ]

    def _send_loop(self) -> None:
        socks: dict[str, zmq.Socket] = {}
        try:
            while (job := self._jobs.get()) is not None:
                seq, dest, source, what, control = job
                try:
                    with self._lock:
                        addr = self._routes[dest]
                        resources = self._pending[seq][2] if seq in self._pending else []
                    frames: list[memoryview] = []
                    if control:
                        head = ENCODER.encode(CtlMsg(seq, self.address, dest, source, list(what)))
                    else:
                        if self.limiter is not None:
                            self.limiter(sum(i.nbytes for i in what))
                        metas, frames, segment = self._pack(addr, what, resources)
                        peer = self._peer_info if segment else b""
                        head = ENCODER.encode(DataMsg(seq, self.address, dest, source, metas, segment, peer))
                    sock = socks.get(addr)
                    if sock is None:
                        sock = socks[addr] = self._push(addr)
                    sock.send_multipart([head, *frames], copy=False)
                except Exception as exc:  # never kill the send thread
                    self._finish(seq, f"send to {dest!r} failed: {exc}")
        finally:
            for s in socks.values():
                s.close(0)

    def _push(self, addr: str, sndhwm: int = 1000) -> zmq.Socket:
        """A PUSH socket connected to ``addr`` (a CURVE client of the cluster when keyed)."""
        sock = self.ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, sndhwm)
        if self.keys is not None:
            self.keys.client(sock)
        try:
            sock.connect(addr)
        except zmq.ZMQError:
            sock.close(0)
            raise
        return sock

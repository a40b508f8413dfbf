"""The ZeroMQ transport's receive side: one thread polls the PULL socket, checks each message
and delivers its items (or control messages) into the sink bound to its destination endpoint, then
acks it to the sender. ``ZmqTransport`` (``zmq_transport.py``) inherits it.

Nothing received can stop the receive thread or make it wait on one peer: every header is
decoded and validated field by field (``DataMsg`` / ``ItemMeta`` / ``CtlMsg`` and the control
messages' constraints: counts >= 0, layers >= 0 (or ``FULL_BLOCK``), a ``tcp://`` or ``ipc://``
``reply_to``, bounded strings, one payload frame per item of the stated size, none for control),
a bad one is dropped and counted in ``drops`` (``runtime/transfer/drops.py``); connecting to a
``reply_to`` that zmq refuses is a drop, not a crash; acks are sent without blocking (an ack
a peer cannot take is dropped and counted; its sender's handle times out) and at most
``MAX_ACK_PEERS`` ack sockets are kept (least recently used closed first).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import msgspec
import zmq

from dualpath.runtime.transfer.auth import Gatekeeper
from dualpath.runtime.transfer.zmq_wire import DECODER, ENCODER, AckMsg, CtlMsg, DataMsg

if TYPE_CHECKING:
    from dualpath.runtime.transfer.base import KVSink, TransferItem
    from dualpath.runtime.transfer.drops import DropCounter

MAX_ACK_PEERS = 256
ACK_HWM = 10_000  # acks queued per peer before one is dropped (never blocking the receive thread)


class ZmqReceiver:
    """Needs the transport's ``ctx``, ``address``, ``drops``, sockets (``_pull``, ``_ctl``,
    ``_monitor``), ``_gate``, ``_ctl_addr``, ``_recv_thread``, ``_lock``, ``_sinks``, ``_push``,
    ``_finish`` and ``_unpack``."""

    ctx: zmq.Context
    address: str
    drops: DropCounter
    _pull: zmq.Socket
    _ctl: zmq.Socket
    _monitor: zmq.Socket | None
    _gate: Gatekeeper | None
    _ctl_addr: str
    _recv_thread: threading.Thread
    _lock: threading.Lock
    _sinks: dict[str, KVSink]

    if TYPE_CHECKING:

        def _push(self, addr: str, sndhwm: int = 1000) -> zmq.Socket: ...

        def _finish(self, seq: int, error: str | None) -> None: ...

        def _unpack(self, msg: DataMsg, frames: list[zmq.Frame]) -> list[TransferItem]: ...

    def _recv_loop(self) -> None:
        acks: OrderedDict[str, zmq.Socket] = OrderedDict()
        ctl = self._ctl
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        poller.register(ctl, zmq.POLLIN)
        if self._monitor is not None:
            poller.register(self._monitor, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if ctl in ready:
                    break
                if self._monitor is not None and self._monitor in ready:
                    Gatekeeper.count(self._monitor, self.drops, "data")
                if self._pull not in ready:
                    continue
                frames = self._pull.recv_multipart(copy=False)
                try:
                    self._on_message(frames, acks)
                except Exception as exc:  # noqa: BLE001 - never kill the receive thread
                    self.drops.drop("data", "handler_error", f"{type(exc).__name__}: {exc}")
        finally:
            for s in acks.values():
                s.close(0)
            ctl.close(0)

    def _on_message(self, frames: list[zmq.Frame], acks: OrderedDict[str, zmq.Socket]) -> None:
        try:
            msg = DECODER.decode(frames[0].buffer)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            cause = "invalid" if isinstance(exc, msgspec.ValidationError) else "undecodable"
            self.drops.drop("data", cause, str(exc))
            return
        if isinstance(msg, AckMsg):
            self._finish(msg.seq, msg.error)
            return
        self._handle(msg, frames, acks)

    def _handle(
        self, msg: DataMsg | CtlMsg, frames: list[zmq.Frame], acks: OrderedDict[str, zmq.Socket]
    ) -> None:
        """Check, deliver and ack one data or control message (on the receive thread)."""
        bad = self._refusal(msg, frames)
        self._ack(msg, f"refused: {bad}" if bad is not None else self._deliver(msg, frames), acks)

    def _refusal(self, msg: DataMsg | CtlMsg, frames: list[zmq.Frame]) -> str | None:
        """Why ``msg`` is refused (counted as a ``bad_frames`` drop); None: it is not."""
        bad = (
            self._check_frames(msg, frames)
            if isinstance(msg, DataMsg)
            else (None if len(frames) == 1 else f"a control message with {len(frames) - 1} payload frames")
        )
        if bad is not None:
            self.drops.drop("data", "bad_frames", bad)
        return bad

    def _ack(self, msg: DataMsg | CtlMsg, error: str | None, acks: OrderedDict[str, zmq.Socket]) -> None:
        sock = self._ack_socket(msg.reply_to, acks)
        if sock is None:
            return
        try:
            sock.send(ENCODER.encode(AckMsg(msg.seq, error)), zmq.NOBLOCK)
        except zmq.Again:  # the peer takes nothing (gone, or not a transport): its handle times out
            self.drops.drop("data", "ack_undeliverable", msg.reply_to)

    def _check_frames(self, msg: DataMsg, frames: list[zmq.Frame]) -> str | None:
        """Why the payload frames do not match the header (None: they do)."""
        if len(frames) != len(msg.items) + 1:
            return f"{len(msg.items)} items but {len(frames) - 1} payload frames"
        for i, m in enumerate(msg.items):
            if len(frames[i + 1].buffer) != m.nbytes:
                return f"item {i} states {m.nbytes} bytes, its frame has {len(frames[i + 1].buffer)}"
        return None

    def _ack_socket(self, addr: str, acks: OrderedDict[str, zmq.Socket]) -> zmq.Socket | None:
        sock = acks.get(addr)
        if sock is not None:
            acks.move_to_end(addr)
            return sock
        try:  # (a deep queue: acks are tiny, and one is dropped only when a peer takes none)
            sock = self._push(addr, sndhwm=ACK_HWM)
        except zmq.ZMQError as exc:
            self.drops.drop("data", "bad_reply_to", f"{addr!r}: {exc}")
            return None
        acks[addr] = sock
        while len(acks) > MAX_ACK_PEERS:
            acks.popitem(last=False)[1].close(0)
        return sock

    def _deliver(self, msg: DataMsg | CtlMsg, frames: list[zmq.Frame]) -> str | None:
        with self._lock:
            sink: Any = self._sinks.get(msg.dest)
        if sink is None:
            return f"unknown endpoint {msg.dest!r} at {self.address}"
        try:
            if isinstance(msg, DataMsg):
                sink.deliver(msg.source, self._unpack(msg, frames))
            elif hasattr(sink, "control"):
                sink.control(msg.source, msg.msgs)
            else:
                self.drops.drop("data", "no_control_sink", msg.dest)
                return f"endpoint {msg.dest!r} takes no control messages"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def _drain(self) -> None:
        """Hook: after the receive thread stopped, before the sockets and context close (a
        subclass stops its own threads that use them here)."""

    def _stop_recv(self) -> None:
        if self._recv_thread.is_alive():
            s = self.ctx.socket(zmq.PUSH)
            s.connect(self._ctl_addr)
            s.send(b"stop")
            s.close(0)
            self._recv_thread.join(5)
        self._drain()
        if self._gate is not None:
            self._gate.stop()
        self._pull.close(0)
        addr = self.address
        if addr.startswith("ipc://"):
            try:
                os.unlink(addr[len("ipc://") :])
            except OSError:
                pass
        self.ctx.term()

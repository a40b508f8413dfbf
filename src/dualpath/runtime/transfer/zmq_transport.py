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
import queue
import tempfile
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import msgspec
import torch
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

MAX_ACK_PEERS = 256
ACK_HWM = 10_000  # acks queued per peer before one is dropped (never blocking the receive thread)
_Meta = msgspec.Meta
_Count = Annotated[int, _Meta(ge=0, le=2**63 - 1)]
_Name = Annotated[str, _Meta(max_length=256)]
_ReplyTo = Annotated[str, _Meta(pattern=r"^(tcp://[^\s/]+:[0-9]{1,5}|ipc:///[^\s]+)$", max_length=512)]


class ItemMeta(msgspec.Struct, array_like=True, frozen=True):
    key: Annotated[str, _Meta(min_length=1, max_length=256)]
    block_index: Annotated[int, _Meta(ge=-1, le=2**31)]
    layer: Annotated[int, _Meta(ge=-1, le=2**16)]  # -1: FULL_BLOCK
    num_tokens: _Count
    token_offset: _Count
    nbytes: _Count
    slot: Annotated[int, _Meta(ge=-1, le=2**63 - 1)] = -1  # shm offset (shm transport); -1 = frame


class DataMsg(msgspec.Struct, array_like=True, frozen=True, tag="d"):
    seq: _Count
    reply_to: _ReplyTo
    dest: _Name
    source: _Name
    items: Annotated[list[ItemMeta], _Meta(max_length=1 << 16)]
    segment: Annotated[str, _Meta(max_length=1024)] = ""


class CtlMsg(msgspec.Struct, array_like=True, frozen=True, tag="c"):
    """Typed control messages for endpoint ``dest`` (no payload frames)."""

    seq: _Count
    reply_to: _ReplyTo
    dest: _Name
    source: _Name
    msgs: Annotated[list[Control], _Meta(max_length=MAX_CONTROLS)]


class AckMsg(msgspec.Struct, array_like=True, frozen=True, tag="a"):
    seq: _Count
    error: Annotated[str, _Meta(max_length=4096)] | None = None


_decoder = msgspec.msgpack.Decoder(DataMsg | AckMsg | CtlMsg)
_encoder = msgspec.msgpack.Encoder()


_Job = tuple[int, str, str, Sequence[Any], bool]  # seq, dest, source, items or controls, control?


def payload_view(payload: Any) -> memoryview:
    """Raw bytes of a payload (a tensor of any dtype is sent as its contiguous bytes)."""
    if isinstance(payload, torch.Tensor):
        t = payload.detach().contiguous()
        if t.device.type != "cpu":
            t = t.cpu()
        return memoryview(t.view(torch.uint8).numpy()).cast("B")  # type: ignore[arg-type]
    return memoryview(payload).cast("B")


class ZmqTransport(Transport):
    """See the module docstring. ``scheme`` "tcp" binds ``tcp://host:*``, "ipc" a socket file."""

    kind = "zmq"

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
                        head = _encoder.encode(CtlMsg(seq, self.address, dest, source, list(what)))
                    else:
                        if self.limiter is not None:
                            self.limiter(sum(i.nbytes for i in what))
                        metas, frames, segment = self._pack(addr, what, resources)
                        head = _encoder.encode(DataMsg(seq, self.address, dest, source, metas, segment))
                    sock = socks.get(addr)
                    if sock is None:
                        sock = socks[addr] = self._push(addr)
                    sock.send_multipart([head, *frames], copy=False)
                except Exception as exc:  # never kill the send thread
                    self._finish(seq, f"send to {dest!r} failed: {exc}")
        finally:
            for s in socks.values():
                s.close(0)

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
            msg = _decoder.decode(frames[0].buffer)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            cause = "invalid" if isinstance(exc, msgspec.ValidationError) else "undecodable"
            self.drops.drop("data", cause, str(exc))
            return
        if isinstance(msg, AckMsg):
            self._finish(msg.seq, msg.error)
            return
        bad = (
            self._check_frames(msg, frames)
            if isinstance(msg, DataMsg)
            else (None if len(frames) == 1 else f"a control message with {len(frames) - 1} payload frames")
        )
        if bad is not None:
            self.drops.drop("data", "bad_frames", bad)
            error: str | None = f"refused: {bad}"
        else:
            error = self._deliver(msg, frames)
        sock = self._ack_socket(msg.reply_to, acks)
        if sock is None:
            return
        try:
            sock.send(_encoder.encode(AckMsg(msg.seq, error)), zmq.NOBLOCK)
        except zmq.Again:  # the peer takes nothing (gone, or not a transport): its handle times out
            self.drops.drop("data", "ack_undeliverable", msg.reply_to)

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

    def _stop_recv(self) -> None:
        if self._recv_thread.is_alive():
            s = self.ctx.socket(zmq.PUSH)
            s.connect(self._ctl_addr)
            s.send(b"stop")
            s.close(0)
            self._recv_thread.join(5)
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

"""A transport whose payload bytes move by a one-sided transfer engine (Mooncake, NIXL).

Same protocol and guarantees as :class:`ZmqTransport` (its subclass): the ZeroMQ messages (CURVE
when keyed) carry the headers, control messages and acks, in one FIFO per destination. Only the
payload bytes take the engine. Each transport registers two buffers with its engine once, at start:
a send ring and a landing buffer, ``ring_bytes`` each, and the caller registers its own KV buffers
once with ``register`` (``regions.py``). A submit sends an item whose payload lies inside a
registered buffer from where it is (no copy: the peer reads it in place; the contract keeps it
unchanged until the handle completes), copies the others into the send ring (one copy, as into the
shm transport's ring), and sends a header naming the slots (absolute addresses) and this
engine's peer name (``DataMsg.segment``, plus ``DataMsg.peer`` when the engine needs more to reach
it: NIXL's agent metadata). The receive thread checks each message and starts one engine READ of
its slots (adjacent slots coalesced) into a range of the landing buffer, up to ``READ_DEPTH``
messages ahead (the landing buffer is generation-tagged, ``regions.Landing``: a read that
failed without its engine confirming it is over keeps its range, and later reads land in a fresh
generation, so a late-landing read never writes a range handed out again); a delivery thread takes the messages in arrival order (so control messages stay
behind the KV sent before them), waits for each read, hands the items to the sink (which copies,
as the contract says), acks (the ack frees the sender's slots) and frees the landing range. A
batch larger than the ring falls back to ordinary ZeroMQ frames.

The engine is an ``Engine`` (this module): ``register`` a buffer, name itself (``segment``,
``peer_info``), ``check_peer`` a received name, ``post`` a read of ranges from a peer and ``wait``
for it, ``close``. The engine bounds how long a read may take (a dead peer fails its message, and
the sender's handle gets the error), so one peer cannot hold the delivery for ever.
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import zmq

from dualpath.core.errors import require
from dualpath.core.units import MiB
from dualpath.runtime.transfer.base import TransferError, TransferItem
from dualpath.runtime.transfer.regions import MAX_RETIRED, Landing, Regions, UnsettledRead, buffer_addr
from dualpath.runtime.transfer.ring import RingAllocator
from dualpath.runtime.transfer.zmq_transport import ZmqTransport
from dualpath.runtime.transfer.zmq_wire import CtlMsg, DataMsg, ItemMeta, payload_view

RING_BYTES = 64 * MiB  # per buffer, as the shm transport's ring (a batch above it goes as frames)
READ_DEPTH = 16  # slot messages whose reads run ahead of the one being delivered (docs/cluster.md)
LANDING_WAIT_S = 30.0  # the longest a read waits for landing room (as the send ring's wait)
Span = tuple[int, int, int]  # local address, remote address, bytes


class _Read:
    """One slot message's read: the engine's token, its landing offset (-1: none), its error."""

    __slots__ = ("error", "land", "landing", "slot", "token", "unsettled", "waited")

    def __init__(self) -> None:
        self.token: Any = None
        self.land = -1
        self.landing: Landing | None = None
        self.unsettled = False  # the engine could not confirm the read is over
        self.error: BaseException | None = None
        self.slot = False  # holds one of the READ_DEPTH places
        self.waited = False


_Job = tuple[Any, list[zmq.Frame], "str | None", "_Read | None"]  # msg, frames, refusal, read


class Engine(Protocol):
    """A one-sided transfer engine as ``OneSidedTransport`` drives it."""

    kind: str
    segment: str  # this engine's peer name (DataMsg.segment)
    peer_info: bytes  # what a peer needs besides the name (b"" when nothing)

    def register(self, addr: int, nbytes: int) -> None: ...

    def check_peer(self, segment: str, peer: bytes) -> str | None:
        """Why a received peer name is not one this engine reads from (None: it is)."""
        ...

    def post(self, segment: str, peer: bytes, spans: Sequence[Span]) -> Any:
        """Start copying each span's remote bytes into local memory; a token for ``wait``."""
        ...

    def wait(self, token: Any) -> None:
        """Until the read of ``token`` is done; raise on failure or timeout."""
        ...

    def close(self) -> None: ...


def coalesce(spans: Sequence[Span]) -> list[Span]:
    """Merge spans adjacent on both sides (one engine request instead of several)."""
    out: list[Span] = []
    for local, remote, n in spans:
        if n == 0:
            continue
        if out and out[-1][0] + out[-1][2] == local and out[-1][1] + out[-1][2] == remote:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + n)
        else:
            out.append((local, remote, n))
    return out


class OneSidedTransport(ZmqTransport):
    """See the module docstring; ``engine`` is made by the caller (``mooncake.py``, ``nixl.py``)."""

    def __init__(
        self,
        engine: Engine,
        *,
        host: str = "127.0.0.1",
        ring_bytes: int = RING_BYTES,
        limiter: Callable[[int], object] | None = None,
        keys: Any = None,
    ) -> None:
        require(ring_bytes >= 4096, "ring_bytes", ring_bytes, "must be >= 4096")
        self.engine = engine
        self.kind = engine.kind
        self.ring_bytes = ring_bytes
        self._send_buf = torch.zeros(ring_bytes, dtype=torch.uint8)  # touched now, not per first send
        self._send_mv = memoryview(self._send_buf.numpy()).cast("B")  # type: ignore[arg-type]
        self._send_addr = self._send_buf.data_ptr()
        engine.register(self._send_addr, ring_bytes)
        self._landing: Landing | None = Landing(ring_bytes, 0, engine.register)
        self._retired: list[Landing] = []  # generations holding a read that never settled
        self._regions = Regions(engine.register)
        self._ring = RingAllocator(ring_bytes)
        self.in_place_bytes = 0  # payload bytes sent from registered buffers (no ring copy)
        self._depth = threading.Semaphore(READ_DEPTH)
        self._inbox: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._reading: _Read | None = None
        self._peer_info = engine.peer_info
        super().__init__(host=host, scheme="tcp", limiter=limiter, keys=keys)
        self._delivery = threading.Thread(target=self._deliver_loop, name="onesided-deliver", daemon=True)
        self._delivery.start()  # (what the receive thread queued before this waits in the inbox)

    def register(self, buf: Any) -> int:
        """Register ``buf`` (a contiguous CPU tensor or buffer: an engine's KV pool) with the engine
        once, so payloads inside it are sent in place; the bytes newly registered (0: already)."""
        with self._lock:
            if self._closed:
                raise TransferError("register on a closed transport")
            n = self._regions.add(buf)
            self._peer_info = self.engine.peer_info  # NIXL: the metadata now names it
        return n

    def _in_place(self, v: memoryview) -> int | None:
        if not len(self._regions) or not v.nbytes:
            return None
        addr, n = buffer_addr(v)
        return self._regions.inside(addr, n)

    def _pack(
        self, dest_addr: str, items: Sequence[TransferItem], resources: list[Any]
    ) -> tuple[list[ItemMeta], list[memoryview], str]:
        views = [payload_view(it.payload) for it in items]
        places = [self._in_place(v) for v in views]
        total = sum(v.nbytes for v in views)
        copied = sum(v.nbytes for v, a in zip(views, places) if a is None)
        if total == 0 or total > self.ring_bytes:
            return super()._pack(dest_addr, items, resources)
        self.in_place_bytes += total - copied
        off = self._ring.alloc(copied) if copied else 0
        if copied:
            resources.append(off)
        metas = []
        for it, v, addr in zip(items, views, places):
            if addr is None:
                self._send_mv[off : off + v.nbytes] = v
                addr, off = self._send_addr + off, off + v.nbytes
            metas.append(
                ItemMeta(it.key, it.block_index, it.layer, it.num_tokens, it.token_offset, v.nbytes, addr)
            )
        return metas, [], self.engine.segment

    def _release(self, resources: list[Any]) -> None:
        for start in resources:
            self._ring.free(start)

    def _check_frames(self, msg: DataMsg, frames: list[zmq.Frame]) -> str | None:
        """A slot message names a peer of this engine, carries no frames and fits the landing
        buffer; the engine checks the slots themselves against the peer's registrations."""
        if not msg.segment:
            return super()._check_frames(msg, frames)
        bad = self.engine.check_peer(msg.segment, msg.peer)
        if bad is not None:
            return bad
        if len(frames) != 1:
            return f"a slot message carries {len(frames) - 1} payload frames"
        total = sum(m.nbytes for m in msg.items)
        if total > self.ring_bytes:
            return f"{total} bytes in one message exceed the {self.ring_bytes}-byte landing buffer"
        if any(m.slot < 0 for m in msg.items):
            return "a slot message with an item outside the sender's ring (slot -1)"
        return None

    # ---- receive thread: check each message, start the reads of slot messages, queue it
    def _handle(
        self, msg: DataMsg | CtlMsg, frames: list[zmq.Frame], acks: OrderedDict[str, zmq.Socket]
    ) -> None:
        bad = self._refusal(msg, frames)
        read = self._post(msg) if bad is None and isinstance(msg, DataMsg) and msg.segment else None
        self._inbox.put((msg, frames, bad, read))

    def _post(self, msg: DataMsg) -> _Read:
        read = _Read()
        try:
            if not self._depth.acquire(timeout=LANDING_WAIT_S):
                raise TransferError(f"{READ_DEPTH} reads in flight for {LANDING_WAIT_S} s")
            read.slot = True
            total = sum(m.nbytes for m in msg.items)
            landing = read.landing = self._landing
            if landing is None:
                raise TransferError(f"{MAX_RETIRED} landing buffers hold reads that never settled")
            read.land = landing.ranges.alloc(total, LANDING_WAIT_S) if total else -1
            spans, off = [], landing.addr + max(read.land, 0)
            for m in msg.items:
                spans.append((off, m.slot, m.nbytes))
                off += m.nbytes
            read.token = self.engine.post(msg.segment, msg.peer, coalesce(spans))
        except Exception as exc:  # the message fails alone, in order, on the delivery thread
            read.error = exc
        return read

    # ---- delivery thread: in arrival order, wait for each read, deliver, ack, free its landing
    def _deliver_loop(self) -> None:
        acks: OrderedDict[str, zmq.Socket] = OrderedDict()
        try:
            while (job := self._inbox.get()) is not None:
                msg, frames, bad, read = job
                self._reading = read
                try:
                    error = f"refused: {bad}" if bad is not None else self._deliver(msg, frames)
                    self._ack(msg, error, acks)
                except Exception as exc:  # noqa: BLE001 - never kill the delivery thread
                    self.drops.drop("data", "handler_error", f"{type(exc).__name__}: {exc}")
                finally:
                    self._reading = None
                    if read is not None:
                        self._retire(read)
        finally:
            for sock in acks.values():
                sock.close(0)

    def _unpack(self, msg: DataMsg, frames: list[zmq.Frame]) -> list[TransferItem]:
        if not msg.segment:
            return super()._unpack(msg, frames)
        read = self._reading
        assert read is not None
        if read.error is not None:
            raise read.error
        read.waited = True
        try:
            self.engine.wait(read.token)
        except UnsettledRead:
            read.unsettled = True
            raise
        assert read.landing is not None
        mv, items, off = read.landing.mv, [], max(read.land, 0)
        for m in msg.items:
            items.append(
                TransferItem(
                    key=m.key,
                    block_index=m.block_index,
                    layer=m.layer,
                    num_tokens=m.num_tokens,
                    token_offset=m.token_offset,
                    payload=mv[off : off + m.nbytes],
                )
            )
            off += m.nbytes
        return items

    def _retire(self, read: _Read) -> None:
        """A read is over once the engine says so: only then its landing range is reused."""
        if read.token is not None and not read.waited:
            try:
                self.engine.wait(read.token)
            except UnsettledRead:
                read.unsettled = True
            except Exception:  # noqa: BLE001 - its message already failed
                pass
        if read.land >= 0 and read.landing is not None:
            if read.unsettled:
                self._retire_landing(read.landing)  # its range is never handed out again
            else:
                read.landing.ranges.free(read.land)
        if read.slot:
            self._depth.release()

    def _retire_landing(self, landing: Landing) -> None:
        """Land later reads in a fresh generation; ``landing`` stays registered until close."""
        if landing is not self._landing:
            return  # already retired by an earlier unsettled read
        self._retired.append(landing)
        if len(self._retired) >= MAX_RETIRED:
            self._landing = None
            return
        try:
            self._landing = Landing(self.ring_bytes, landing.gen + 1, self.engine.register)
        except Exception as exc:  # noqa: BLE001 - no fresh buffer: later reads fail, none reuse
            self._landing = None
            self.drops.drop("data", "handler_error", f"no fresh landing buffer: {exc}")

    def _drain(self) -> None:
        self._inbox.put(None)
        self._delivery.join(LANDING_WAIT_S)

    def close(self) -> None:
        with self._lock:
            closed = self._closed
        super().close()  # stops the threads first: no read lands after this
        if not closed:
            self.engine.close()

"""An engine's heartbeat thread, running from process start (before the model loads).

While the engine loads it sends ``EngineLoading`` every ``heartbeat_s`` (the scheduler lists it as
loading; nothing takes it for dead); once the engine serves (``attach``) it sends ``Heartbeat``
(load, read queue, byte and store counters) every ``heartbeat_s`` and the outbox's express
messages at once, from its own socket, so a long batch on the main thread never silences it. A
``Reset`` the scheduler sends to this socket means the scheduler does not know this engine (it
restarted and lost its state): ``reregister`` is set and the main loop registers again.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING

import zmq

from dualpath.runtime.cluster.memory import rss_bytes
from dualpath.runtime.cluster.messages import (
    DECODE_ERRORS,
    EngineLoading,
    Heartbeat,
    Reset,
    decode,
    encode,
)
from dualpath.runtime.transfer.auth import ClusterKeys

if TYPE_CHECKING:
    from dualpath.runtime.cluster.engine_main import EngineArgs
    from dualpath.runtime.cluster.kvio import BlockIO, Outbox
    from dualpath.runtime.cluster.traffic import TrafficManager


def dealer(ctx: zmq.Context, address: str, keys: ClusterKeys | None) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        keys.client(sock)
    sock.connect(address)
    return sock


class Beat(threading.Thread):
    def __init__(self, ctx: zmq.Context, args: EngineArgs, keys: ClusterKeys | None) -> None:
        super().__init__(daemon=True, name="dualpath-heartbeat")
        self.ctx, self.args, self.keys = ctx, args, keys
        self.stop = threading.Event()
        self.reregister = threading.Event()
        self._parts: tuple[int, object, BlockIO, TrafficManager] | None = None

    def attach(self, eid: int, worker: object, io: BlockIO, traffic: TrafficManager) -> None:
        """The engine serves as ``eid``: heartbeats from now on."""
        self._parts = (eid, worker, io, traffic)

    def close(self) -> None:
        self.stop.set()
        if self._parts is not None:
            self._parts[1].outbox.wake.set()  # type: ignore[attr-defined]
        self.join(2)

    def run(self) -> None:
        sock = dealer(self.ctx, self.args.scheduler, self.keys)
        next_s = time.monotonic()
        try:
            while not self.stop.is_set():
                parts = self._parts
                wait_s = max(next_s - time.monotonic(), 0.0)
                if parts is None:
                    self.stop.wait(wait_s)
                else:
                    outbox: Outbox = parts[1].outbox  # type: ignore[attr-defined]
                    outbox.wake.wait(wait_s)
                    for msg in outbox.drain_express():
                        sock.send(encode(msg))  # type: ignore[arg-type]
                self._incoming(sock)
                if time.monotonic() < next_s:
                    continue
                next_s = time.monotonic() + self.args.cluster.engine.heartbeat_s
                sock.send(encode(self._beat(parts)))
        finally:
            sock.close(0)

    def _beat(self, parts: tuple[int, object, BlockIO, TrafficManager] | None) -> EngineLoading | Heartbeat:
        a = self.args
        if parts is None:
            return EngineLoading(
                engine_id=a.engine_id,
                role=a.role,
                node_id=a.node_id,  # type: ignore[arg-type]
                pid=os.getpid(),
                generation=a.generation,
            )
        eid, worker, io, traffic = parts
        seqs, toks = worker.load()  # type: ignore[attr-defined]
        paths, nics = traffic.snapshot()
        st = io.store.stats()
        return Heartbeat(
            engine_id=eid,
            num_seqs=seqs,
            num_tokens=toks,
            read_queue_tokens=io.read_queue_tokens,
            bytes_by_path=paths,
            bytes_by_nic=nics,
            store_counts=st.health_counts(),
            store_write_errors=st.write_errors,
            dropped=worker.transport.drops.snapshot(),  # type: ignore[attr-defined]
            failed_requests=worker.num_failed_requests,  # type: ignore[attr-defined]
            rss_bytes=rss_bytes(),
        )

    def _incoming(self, sock: zmq.Socket) -> None:
        while sock.poll(0):
            try:
                msg = decode(sock.recv(zmq.NOBLOCK))
            except (zmq.Again, *DECODE_ERRORS):
                continue
            if isinstance(msg, Reset) and self._parts is not None:
                self.reregister.set()

"""The scheduler service: one ROUTER socket for engines and clients, request state, policy calls.

Each tick (every ``tick_s`` or after messages) it: marks engines dead after ``engine_timeout_s``
without a message and re-dispatches or fails their requests; runs one fetch round of the policy's
ledger (``ClusterState.fetch``: DE groups, then PE groups, in ``policy.fetch.RUNTIME_ORDER``); sends
DecodeTask then PrefillTask for each request that got both engines. Token events from DEs are forwarded to the
request's client with RequestStats on the last one. ``SchedulerCore`` (``sched_core.py``) is all of
that without a socket (messages in, messages out); ``SchedulerService`` here puts it on the ROUTER
socket, and the conformance trace driver (``adapter.py``) feeds the core the recorded traces.
"""

from __future__ import annotations

import time

import msgspec
import zmq

from dualpath.runtime.cluster.config import SchedulerArgs
from dualpath.runtime.cluster.messages import Shutdown, encode
from dualpath.runtime.cluster.sched_core import SchedulerCore
from dualpath.runtime.transfer.auth import Gatekeeper, load_keys


class SchedulerService(SchedulerCore):
    """The scheduler process: ``SchedulerCore`` on one zmq ROUTER socket (CURVE when keyed)."""

    def __init__(self, args: SchedulerArgs) -> None:
        super().__init__(args)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        keys = load_keys(args.key_file)
        self.gate = Gatekeeper(self.ctx, keys) if keys else None
        if keys:
            keys.server(self.sock)
        self.monitor = self.gate.monitor(self.sock) if self.gate else None
        bind = args.bind.replace(":0", ":*") if args.bind.endswith(":0") else args.bind
        self.sock.bind(bind)
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    # ------------------------------------------------------------------ main loop
    def serve_forever(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while self.running:
            self.run_once(poller, int(self.args.cluster.scheduler.tick_s * 1000) or 1)
        self.close()

    def run_once(self, poller: zmq.Poller, timeout_ms: int, now: float | None = None) -> None:
        """Handle what arrived within ``timeout_ms`` (at most 1,000 messages), then tick at ``now``
        (the clock by default; tests pass their own)."""
        if poller.poll(timeout_ms):
            for _ in range(1000):
                try:
                    frames = self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.handle(frames[0], frames[-1], now)
        if self.monitor is not None:
            Gatekeeper.count(self.monitor, self.drops, "control")
        self.tick(time.monotonic() if now is None else now)

    def close(self) -> None:
        for e in self.state.engines.values():
            if e.alive:
                self._send(e.identity, Shutdown(reason="scheduler stopping"))
        if self.gate is not None:
            self.gate.stop()
        self.sock.close(0)
        self.ctx.term()

    def _send(self, identity: bytes, msg: object) -> None:
        self.sock.send_multipart([identity, encode(msg)])  # type: ignore[arg-type]

    def _to_client(self, identity: bytes, msg: object) -> None:
        self.sock.send_multipart([identity, b"", encode(msg)])  # type: ignore[arg-type]


def main() -> None:
    """``python -m dualpath.runtime.cluster.scheduler '<SchedulerArgs as JSON>'``."""
    import sys
    from pathlib import Path

    svc = SchedulerService(msgspec.json.decode(sys.argv[1].encode(), type=SchedulerArgs))
    if svc.args.port_file:
        Path(svc.args.port_file).write_text(svc.address)
    try:
        svc.serve_forever()
    except KeyboardInterrupt:
        svc.close()


if __name__ == "__main__":
    main()

"""An engine process's main loop: scheduler messages in (tasks, cancels, resets, peers,
Configure; a bad or failing one dropped and counted), worker steps, outbox messages out, until
Shutdown; and registering again with a scheduler that restarted (``Reregister``).
``engine_main.py`` runs it.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable

import msgspec
import zmq

from dualpath.runtime.cluster.kvio import Outbox
from dualpath.runtime.cluster.messages import (
    DECODE_ERRORS,
    Cancel,
    Configure,
    DecodeTask,
    EngineHello,
    Peers,
    PrefillTask,
    Reset,
    Shutdown,
    Welcome,
    decode,
    encode,
)
from dualpath.runtime.transfer.drops import DropCounter


class Reregister:
    """Registering again with a scheduler that lost this engine (it restarted): drop every task,
    send the hello (same id); the Welcome (or a refusal) comes back through the main loop."""

    def __init__(self, flag: threading.Event, hello: EngineHello) -> None:
        self.flag, self.hello = flag, hello

    def __call__(self, sock: zmq.Socket, worker: object) -> None:
        if not self.flag.is_set():
            return
        self.flag.clear()
        print(
            f"engine {self.hello.engine_id}: the scheduler does not know this engine (it "
            "restarted); dropping every task and registering again",
            flush=True,
        )
        worker.reset()  # type: ignore[attr-defined]
        sock.send(encode(self.hello))


def set_peers(transport: object, peers: dict[int, str], me: int) -> None:
    routes = transport.routes()  # type: ignore[attr-defined]
    for pid, addr in peers.items():
        if pid != me:
            transport.add_route(f"e{pid}", addr)  # type: ignore[attr-defined]
    for name in routes:  # (``e<id>.<x>`` names are this engine's local endpoints)
        if name != f"e{me}" and name[1:].isdigit() and int(name[1:]) not in peers:
            transport.fail_endpoint(name, f"engine {name[1:]} is gone")  # type: ignore[attr-defined]


MAX_STEP_FAILURES = 5  # consecutive steps raising out of the worker: the engine is broken, exit


def main_loop(
    sock: zmq.Socket,
    worker: object,
    outbox: Outbox,
    transport: object,
    eid: int,
    configure: Callable[[Configure], None],
    drops: DropCounter,
    again: Callable[[zmq.Socket, object], None] = lambda s, w: None,
) -> None:
    """Serve until Shutdown. A message that does not decode, or whose handling raises, is dropped
    and counted (a task whose handling raises is failed alone); the workers isolate per-request
    failures in their steps. Only ``MAX_STEP_FAILURES`` steps in a row raising out of the worker
    (the engine itself is broken) end the loop with that error."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    step_failures = 0
    while True:
        again(sock, worker)
        busy = worker.has_work()  # type: ignore[attr-defined]
        for _sock, _ in poller.poll(0 if busy else 2):
            while True:
                try:
                    raw = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    msg = decode(raw)
                except DECODE_ERRORS as exc:
                    _undecodable(drops, exc)
                    continue
                if isinstance(msg, Shutdown):
                    print(f"engine {eid}: stopped by the scheduler ({msg.reason})", flush=True)
                    return
                if isinstance(msg, Welcome) and msg.engine_id != eid:  # (registered again)
                    print(f"engine {eid}: registered again as {msg.engine_id}; exiting", flush=True)
                    return
                try:
                    _handle(msg, worker, transport, eid, configure, drops)
                except Exception as exc:  # noqa: BLE001 - one message must not end the engine
                    _handler_failed(msg, worker, drops, exc)
        if busy:
            try:
                worker.step()  # type: ignore[attr-defined]
                step_failures = 0
            except Exception:
                step_failures += 1
                traceback.print_exc()
                if step_failures >= MAX_STEP_FAILURES:
                    print(f"engine {eid}: {step_failures} steps in a row failed; exiting", flush=True)
                    raise
        for out in outbox.drain():
            sock.send(encode(out))  # type: ignore[arg-type]


def _undecodable(drops: DropCounter, exc: Exception) -> None:
    """Count a control message that did not decode (error path only)."""
    drops.drop(
        "control",
        "invalid" if isinstance(exc, msgspec.ValidationError) else "undecodable",
        str(exc),
    )


def _handler_failed(msg: object, worker: object, drops: DropCounter, exc: Exception) -> None:
    """Count a message whose handling raised; a task that could not be taken fails alone (error
    path only)."""
    drops.drop("control", "handler_error", f"{type(msg).__name__}: {type(exc).__name__}: {exc}")
    if isinstance(msg, (PrefillTask, DecodeTask)):
        worker.fail_task(  # type: ignore[attr-defined]
            msg.request_id, "the task could not be taken (see the engine log)", exc
        )


def _handle(
    msg: object,
    worker: object,
    transport: object,
    eid: int,
    configure: Callable[[Configure], None],
    drops: DropCounter,
) -> None:
    if isinstance(msg, (PrefillTask, DecodeTask)):
        worker.add(msg)  # type: ignore[attr-defined]
    elif isinstance(msg, Cancel):
        worker.cancel(msg.request_id)  # type: ignore[attr-defined]
    elif isinstance(msg, Reset):
        print(f"engine {eid}: reset by the scheduler ({msg.reason})", flush=True)
        worker.reset()  # type: ignore[attr-defined]
    elif isinstance(msg, (Peers, Welcome)):  # (a Welcome: registered again with a new scheduler)
        set_peers(transport, msg.peers, eid)
    elif isinstance(msg, Configure):
        configure(msg)
    else:  # engine -> scheduler messages never come this way
        drops.drop("control", "unexpected", type(msg).__name__)

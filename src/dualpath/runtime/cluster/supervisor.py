"""Supervision of a local cluster's processes: the scheduler and every engine.

A thread of the process that started the cluster (``LocalCluster``, so ``dualpath serve``) polls
each child every ``poll_s``. A child that exited is restarted after a backoff (``first_backoff_s``,
doubling while it keeps dying within ``stable_s`` of its start, at most ``max_backoff_s``), at most
``max_restarts`` times in all; every restart is counted per role. The scheduler hears of an exited
engine at once (``Supervision.lost``: its requests are retried or failed now, not after the
heartbeat timeout) and of the restart counts and what is down in a report every ``report_s``; a
restarted engine registers again under its old id, a restarted scheduler binds the same address
and rebuilds its state from the engines' registrations and the store. A scheduler that answers no
health query for ``hung_s`` (stopped, wedged) and an engine the scheduler has held dead for
``hung_s`` while its process still runs are killed, then restarted like the others.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import zmq

from dualpath.runtime.cluster.messages import DECODE_ERRORS, Query, QueryReply, Supervision, decode, encode
from dualpath.runtime.cluster.supervisor_view import engine_name

if TYPE_CHECKING:
    from dualpath.runtime.cluster.local import LocalCluster


def backoff_s(failures: int, first_s: float, cap_s: float) -> float:
    """Wait before restarting a process that died ``failures`` times in a row (1, 2, ...)."""
    return min(first_s * 2 ** (failures - 1), cap_s)


@dataclass(slots=True, kw_only=True)
class _Child:
    name: str  # "scheduler" | "engine<id>"
    role: str  # "scheduler" | "prefill" | "decode"
    engine_id: int = -1
    started_s: float = field(default_factory=time.monotonic)
    dead_s: float | None = None
    restart_at_s: float = 0.0
    failures: int = 0  # deaths in a row, each within stable_s of its start

    @property
    def what(self) -> str:
        return "scheduler" if self.role == "scheduler" else engine_name(self.role, self.engine_id)


class Supervisor(threading.Thread):
    def __init__(
        self,
        cluster: LocalCluster,
        *,
        poll_s: float = 0.1,
        first_backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        stable_s: float = 30.0,
        max_restarts: int = 50,
        report_s: float = 1.0,
        hung_s: float = 20.0,
    ) -> None:
        super().__init__(daemon=True, name="dualpath-supervisor")
        self.cluster = cluster
        self.poll_s, self.first_backoff_s, self.max_backoff_s = poll_s, first_backoff_s, max_backoff_s
        self.stable_s, self.max_restarts, self.report_s, self.hung_s = (
            stable_s,
            max_restarts,
            report_s,
            hung_s,
        )
        self.children = [_Child(name="scheduler", role="scheduler")] + [
            _Child(name=f"engine{e}", role=cluster.config.role_of(e), engine_id=e)
            for e in cluster.engine_procs
        ]
        self.restarts: dict[str, int] = {}
        self.lost: dict[int, int] = {}  # engine id -> pid of its last exited process
        self.down: dict[str, float] = {}  # what -> since (Unix s)
        self.events: list[str] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()  # held while a child is checked or replaced
        self._answered_s = time.monotonic()
        self._query_id = 0

    @property
    def num_restarts(self) -> int:
        return sum(self.restarts.values())

    def close(self) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join(5)

    def _note(self, text: str) -> None:
        self.events.append(text)
        print(f"supervisor: {text}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        sock = self._socket()
        next_report = 0.0
        try:
            while not self.stopping.wait(self.poll_s):
                now = time.monotonic()
                changed = False
                for child in self.children:
                    with self.lock:
                        if self.stopping.is_set():
                            return
                        try:
                            changed |= self._check(child, now)
                        except Exception as exc:  # noqa: BLE001 - the supervisor must go on
                            self._note(f"checking {child.what} failed: {type(exc).__name__}: {exc}")
                self._replies(sock, now)
                if changed or now >= next_report:
                    next_report = now + self.report_s
                    self._send(
                        sock,
                        Supervision(restarts=dict(self.restarts), lost=dict(self.lost), down=dict(self.down)),
                    )
                    self._query_id += 1
                    self._send(sock, Query(query_id=self._query_id, what="health"))
        finally:
            sock.close(0)

    def _socket(self) -> zmq.Socket:
        sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.cluster.keys is not None:
            self.cluster.keys.client(sock)
        sock.connect(self.cluster.address)
        return sock

    @staticmethod
    def _send(sock: zmq.Socket, msg: object) -> None:
        try:
            sock.send_multipart([b"", encode(msg)], zmq.NOBLOCK)  # type: ignore[arg-type]
        except zmq.Again:  # (the scheduler is down: the next report goes to its successor)
            pass

    def _check(self, child: _Child, now: float) -> bool:
        """Note a death, restart when its backoff is over; True if something changed."""
        proc = self.cluster.proc(child.name)
        if proc.poll() is None:
            return False
        if child.dead_s is None:
            child.dead_s = now
            child.failures = child.failures + 1 if now - child.started_s < self.stable_s else 1
            backoff = backoff_s(child.failures, self.first_backoff_s, self.max_backoff_s)
            child.restart_at_s = now + backoff
            self.down[child.what] = time.time()
            if child.engine_id >= 0:
                self.lost[child.engine_id] = proc.pid
            self._note(
                f"{child.what} (pid {proc.pid}) exited with code {proc.returncode}; "
                f"restart in {backoff:.1f} s"
            )
            return True
        if now < child.restart_at_s or self.num_restarts >= self.max_restarts:
            return False
        try:
            new = self.cluster.respawn(child.name)
        except OSError as exc:  # (fork failed: try again after the next backoff)
            child.restart_at_s = now + self.max_backoff_s
            self._note(f"restarting {child.what} failed: {exc}")
            return False
        self.restarts[child.role] = self.restarts.get(child.role, 0) + 1
        self.down.pop(child.what, None)
        child.dead_s, child.started_s = None, now
        if child.role == "scheduler":
            self._answered_s = now
        self._note(
            f"restarted {child.what} (pid {new.pid}; restart {self.restarts[child.role]} "
            f"of role {child.role})"
        )
        return True

    # ------------------------------------------------------------------ hung processes
    def _replies(self, sock: zmq.Socket, now: float) -> None:
        """Health answers: the scheduler lives; engines it holds dead while their process runs
        past ``hung_s`` are killed (then restarted). No answer for ``hung_s``: kill the scheduler."""
        while sock.poll(0):
            try:
                reply = decode(sock.recv_multipart(zmq.NOBLOCK)[-1])
            except (zmq.Again, *DECODE_ERRORS):
                continue
            if isinstance(reply, QueryReply) and reply.health is not None:
                self._answered_s = now
                self._kill_held_dead(reply, now)
        sched = self.cluster.proc("scheduler")
        if now - self._answered_s > self.hung_s and sched.poll() is None:
            self._note(f"scheduler answered no health query for {now - self._answered_s:.0f} s; killing it")
            sched.send_signal(signal.SIGKILL)
            self._answered_s = now

    def _kill_held_dead(self, reply: QueryReply, now: float) -> None:
        assert reply.health is not None
        wall = time.time()
        for item in reply.health.unavailable:
            if item.state != "dead" or wall - item.since_unix_s < self.hung_s:
                continue
            child = next((c for c in self.children if c.what == item.what), None)
            if child is None or now - child.started_s < self.hung_s:  # (not a fresh restart)
                continue
            proc = self.cluster.proc(child.name)
            if proc.poll() is None:
                self._note(
                    f"{item.what} held dead for {wall - item.since_unix_s:.0f} s while its "
                    "process runs; killing it"
                )
                proc.send_signal(signal.SIGKILL)  # (a stopped process dies at it too)

"""Supervision of a local cluster's processes, in the supervisor's own process (its main thread:
an HTTP flood in the serve process can neither take its file descriptors nor its CPU time).

Every ``poll_s`` it checks each child. One that exited is one death (the exit, and whether the
kernel's OOM killer took it, logged; ``Supervision.exited`` lets the scheduler count it once) and
is restarted as the next generation of its engine id after a backoff (``first_backoff_s``, doubling
while it keeps dying within ``stable_s`` of its start, at most ``max_backoff_s``, at least
``oom_backoff_s`` after an OOM kill), through a warm standby when one is ready. A process restarted
``restart_burst`` times within ``restart_interval_s`` is not restarted again: the cluster reports
itself unhealthy with the reason. The scheduler hears of an exited engine at once (``lost``) and
gets a report every ``report_s``; a restarted scheduler binds the same address and restores its
settings and counters. Hung processes, judged only on fresh health answers: a scheduler that
answers no health query for ``hung_s``; an engine process the scheduler holds dead for ``hung_s``,
or has had no sign of (loading, starting or ready) for ``hung_s`` since its start; both killed,
then restarted. Time the supervisor itself was stalled (its loop late by more than
``STALL_GRACE_S``: a SIGSTOP, a paused VM) is credited to every such clock before it judges anyone.
Standbys (``SupervisorConfig.standby``) are kept at their number: a used or dead one is replaced.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import zmq

from dualpath.runtime.cluster.api import StandbyHealth
from dualpath.runtime.cluster.memory import rss_bytes
from dualpath.runtime.cluster.messages import Query, Supervision, encode
from dualpath.runtime.cluster.oom import OomWatch, exit_text
from dualpath.runtime.cluster.supervisor_judge import HungChecks
from dualpath.runtime.cluster.supervisor_view import engine_name

if TYPE_CHECKING:
    from dualpath.runtime.cluster.config import SupervisorConfig
    from dualpath.runtime.cluster.local_procs import ClusterProcesses

STALL_GRACE_S = 1.0  # the loop this much later than poll_s: the supervisor itself was stalled
EXITED_KEPT = 8  # pids of exited processes per engine sent to the scheduler (deaths counted once)


def backoff_s(failures: int, first_s: float, cap_s: float) -> float:
    """Wait before restarting a process that died ``failures`` times in a row (1, 2, ...)."""
    return min(first_s * 2 ** (failures - 1), cap_s)


@dataclass(slots=True, kw_only=True)
class _Child:
    name: str  # "scheduler" | "engine<id>"
    role: str  # "scheduler" | "prefill" | "decode"
    engine_id: int = -1
    pid: int = 0
    generation: int = 0
    started_s: float = field(default_factory=time.monotonic)
    heard_s: float = field(default_factory=time.monotonic)  # last sign of life of ``pid``
    dead_s: float | None = None
    restart_at_s: float = 0.0
    failures: int = 0  # deaths in a row, each within stable_s of its start
    restarted: deque[float] = field(default_factory=deque)  # restart times in the budget window
    given_up: str = ""
    oom: OomWatch | None = None

    @property
    def what(self) -> str:
        return "scheduler" if self.role == "scheduler" else engine_name(self.role, self.engine_id)


class Supervisor(HungChecks):
    def __init__(self, procs: ClusterProcesses, cfg: SupervisorConfig, status: object = None) -> None:
        self.procs, self.cfg, self.status = procs, cfg, status
        self.hung_s = cfg.hung_s
        self.children = [_Child(name="scheduler", role="scheduler")] + [
            _Child(name=f"engine{e}", role=procs.config.role_of(e), engine_id=e)
            for e in range(procs.config.num_engines)
        ]
        for c in self.children:
            c.pid = procs.proc(c.name).pid
            c.oom = OomWatch.of(c.pid)
        self.restarts: dict[str, int] = {}
        self.engine_restarts: dict[int, int] = {}
        self.lost: dict[int, int] = {}  # engine id -> pid of its last exited process
        self.exited: dict[int, list[int]] = {}
        self.down: dict[str, float] = {}  # what -> since (Unix s), until its new process is ready
        self.why: dict[str, str] = {}  # what -> how its last process ended
        self.unhealthy = ""
        self.events: list[str] = []
        self.stopping = threading.Event()
        self._answered_s = self._reply_s = time.monotonic()
        self._judge_after_s = 0.0
        self._standby_at_s = 0.0
        self._standby_failures = 0
        self._query_id = 0

    @property
    def num_restarts(self) -> int:
        return sum(self.restarts.values())

    def _note(self, text: str) -> None:
        self.events.append(text)
        del self.events[:-200]
        print(f"supervisor: {text}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ the loop
    def run(self, supervise: bool = True) -> None:
        """Until ``stopping``: with ``supervise``, restart, report and judge; without, only reap
        children and note their exits (the scheduler then fails what they held at once)."""
        sock = self._socket()
        next_report, last = 0.0, time.monotonic()
        try:
            while not self.stopping.wait(self.cfg.poll_s):
                now = time.monotonic()
                self._credit_stall(now - last - self.cfg.poll_s, now)
                last = now
                changed = False
                for child in self.children:
                    try:
                        changed |= self._check(child, now, supervise)
                    except Exception as exc:  # noqa: BLE001 - the supervisor must go on
                        self._note(f"checking {child.what} failed: {type(exc).__name__}: {exc}")
                if supervise:
                    changed |= self._keep_standbys(now)
                    self._replies(sock, now)
                    if changed or now >= next_report:
                        next_report = now + self.cfg.report_s
                        self._send(sock, self.report())
                        self._query_id += 1
                        self._send(sock, Query(query_id=self._query_id, what="health"))
                if self.status is not None:
                    self.status.write(self)  # type: ignore[attr-defined]
        finally:
            sock.close(0)

    def report(self) -> Supervision:
        standby = [StandbyHealth(pid=sb.proc.pid, warm=sb.warm, rss_bytes=rss_bytes(sb.proc.pid))
                   for sb in self.procs.standbys]  # fmt: skip
        return Supervision(restarts=dict(self.restarts), lost=dict(self.lost), down=dict(self.down),
                           exited={k: list(v) for k, v in self.exited.items()},
                           engine_restarts=dict(self.engine_restarts), unhealthy=self.unhealthy,
                           given_up=[c.what for c in self.children if c.given_up], standby=standby,
                           why={k: v for k, v in self.why.items() if k in self.down or k in self.unhealthy})  # fmt: skip

    def _credit_stall(self, late_s: float, now: float) -> None:
        """The loop ran ``late_s`` late: this process was stalled, not the others; shift every
        clock it judges by and wait for fresh health answers before judging."""
        if late_s <= STALL_GRACE_S:
            return
        self._answered_s += late_s
        self._reply_s += late_s
        for c in self.children:
            c.heard_s += late_s
        self._judge_after_s = now + 2 * self.cfg.report_s
        self._note(f"this supervisor was stalled for {late_s:.1f} s; credited before judging others")

    def _socket(self) -> zmq.Socket:
        sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.procs.keys is not None:
            self.procs.keys.client(sock)
        sock.connect(self.procs.address)
        return sock

    @staticmethod
    def _send(sock: zmq.Socket, msg: object) -> None:
        try:
            sock.send_multipart([b"", encode(msg)], zmq.NOBLOCK)  # type: ignore[arg-type]
        except zmq.Again:  # (the scheduler is down: the next report goes to its successor)
            pass

    # ------------------------------------------------------------------ deaths and restarts
    def _check(self, child: _Child, now: float, supervise: bool) -> bool:
        """Note a death, restart when its backoff is over; True if something changed."""
        proc = self.procs.proc(child.name)
        if proc.poll() is None:
            return False
        if child.dead_s is None:
            self._died(child, proc.returncode, now, supervise)
            return True
        if not supervise or child.given_up or now < child.restart_at_s:
            return False
        return self._restart(child, now)

    def _died(self, child: _Child, code: int | None, now: float, supervise: bool) -> None:
        child.dead_s = now
        child.failures = child.failures + 1 if now - child.started_s < self.cfg.stable_s else 1
        oom = child.oom.verdict(code) if child.oom is not None else ""
        wait = backoff_s(child.failures, self.cfg.first_backoff_s, self.cfg.max_backoff_s)
        wait = max(wait, self.cfg.oom_backoff_s) if oom else wait
        child.restart_at_s = now + wait
        self.down.setdefault(child.what, time.time())
        if child.engine_id >= 0:
            self.lost[child.engine_id] = child.pid
            pids = self.exited.setdefault(child.engine_id, [])
            pids.append(child.pid)
            del pids[:-EXITED_KEPT]
        how = f"{exit_text(code)}{'; ' + oom if oom else ''}"
        self.why[child.what] = f"{child.what} (pid {child.pid}) {how}"
        while child.restarted and now - child.restarted[0] > self.cfg.restart_interval_s:
            child.restarted.popleft()
        if supervise and len(child.restarted) >= self.cfg.restart_burst:
            child.given_up = (
                f"{child.what} (pid {child.pid}) {how} after {len(child.restarted)} restarts in "
                f"{self.cfg.restart_interval_s:.0f} s (restart burst {self.cfg.restart_burst}); not restarted"
            )
            self.unhealthy = child.given_up
            self.down.pop(child.what, None)  # (dead, not restarting)
            self._note(child.given_up)
            return
        self._note(f"{child.what} (pid {child.pid}, generation {child.generation}) {how}"
                   + (f"; restart in {wait:.1f} s" if supervise else ""))  # fmt: skip

    def _restart(self, child: _Child, now: float) -> bool:
        gen = child.generation + 1
        try:
            new, via = self.procs.respawn(child.name, gen)
        except OSError as exc:  # (fork failed: try again after the next backoff)
            child.restart_at_s = now + self.cfg.max_backoff_s
            self._note(f"restarting {child.what} failed: {exc}")
            return False
        self.restarts[child.role] = self.restarts.get(child.role, 0) + 1
        if child.engine_id >= 0:
            self.engine_restarts[child.engine_id] = self.engine_restarts.get(child.engine_id, 0) + 1
        child.restarted.append(now)
        child.dead_s, child.started_s, child.heard_s = None, now, now
        child.pid, child.generation, child.oom = new.pid, gen, OomWatch.of(new.pid)
        if child.role == "scheduler":
            self._answered_s = now
        self._note(
            f"restarted {child.what} as pid {new.pid} (generation {gen}"
            f"{', a warm standby' if via else ''}; restart {self.restarts[child.role]} of role {child.role})"
        )
        return True

    def _keep_standbys(self, now: float) -> bool:
        """Replace used or dead standbys (a dead one after a backoff)."""
        changed = False
        for sb in list(self.procs.standbys):
            if sb.proc.poll() is not None:
                self.procs.standbys.remove(sb)
                self._standby_failures += 1
                wait = backoff_s(self._standby_failures, self.cfg.first_backoff_s, self.cfg.max_backoff_s)
                self._standby_at_s = now + wait
                self._note(
                    f"standby (pid {sb.proc.pid}) {exit_text(sb.proc.returncode)}; replaced in {wait:.1f} s"
                )
                changed = True
        if len(self.procs.standbys) < self.cfg.standby and now >= self._standby_at_s:
            sb = self.procs.new_standby()
            self._note(f"started standby pid {sb.proc.pid}")
            changed = True
        if any(sb.warm for sb in self.procs.standbys):
            self._standby_failures = 0
        return changed

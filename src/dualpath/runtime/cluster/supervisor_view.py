"""The scheduler's side of process supervision (see runtime/cluster/supervisor.py for the other).

What the scheduler service knows about its engines as processes: the pid each registered with, the
engines still loading (``EngineLoading`` from their heartbeat thread, with their generation), when
and why each was declared dead, the supervisor's last ``Supervision`` report (restart counts,
engine processes seen exiting, a reason to be unhealthy, the standbys). Deaths are counted once per
process (pid), whether the process was registered (declared dead: exited or silent) or died while
loading (the supervisor saw it exit); a revival is a process declared dead that answered again.
It also asks engines it does not know (a scheduler restart forgot them) to register again, ends
requests that wait for a role with no live engine (at once when no supervisor reports, after
``ORPHAN_WAIT_S`` otherwise; new requests for such a role are admitted to wait while one of its
engines is on its way back, ``coming_back``) and forgets engines that left (dead ``left_grace_s`` with no restart).
``health_view.py`` turns this into ``/health``'s one entry per engine.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from dualpath.runtime.cluster.messages import EngineHello, EngineLoading, Heartbeat, Reset, Supervision

if TYPE_CHECKING:
    from dualpath.runtime.cluster.scheduler import SchedulerService

LOADING_TTL_S = 10.0  # a loading engine not heard of for this long is no longer listed
SUPERVISED_S = 5.0  # a supervisor report this recent: lost engines come back (requests wait)
ORPHAN_WAIT_S = 30.0  # with a supervisor: how long requests wait for a role with no live engine
REREGISTER_EVERY_S = 1.0  # how often an unknown engine is asked to register again
COUNTED_PIDS = 64  # per engine: pids whose death was counted (deduplication)


def engine_name(role: str, engine_id: int) -> str:
    return f"{role} engine {engine_id}"


class Loading:
    """An engine process heard loading (not registered yet)."""

    __slots__ = ("eid", "role", "node_id", "pid", "generation", "since_unix_s", "heard_s")

    def __init__(self, msg: EngineLoading, now: float, since_unix_s: float) -> None:
        self.eid, self.role, self.node_id = msg.engine_id, msg.role, msg.node_id
        self.pid, self.generation = msg.pid, msg.generation
        self.since_unix_s, self.heard_s = since_unix_s, now


class SupervisionView:
    def __init__(self, svc: SchedulerService) -> None:
        self.svc = svc
        self.pids: dict[int, int] = {}  # engine id -> pid it registered with
        self.dead_since: dict[int, float] = {}  # engine id -> Unix time it was declared dead
        self.dead_reason: dict[int, str] = {}
        self.dead_mono: dict[int, float] = {}  # engine id -> monotonic time it was declared dead
        self.started_unix: dict[int, float] = {}  # engine id -> Unix time it registered
        self.loading: dict[str, Loading] = {}  # name -> the loading process
        self.report: Supervision | None = None
        # A scheduler its supervisor started (a restart, say) is supervised before the first report
        # comes (within a second): a request sent meanwhile waits for a restarting engine.
        self.report_s = time.monotonic() if svc.args.supervised else float("-inf")
        self.asked: dict[int, float] = {}  # engine id -> when last asked to register again
        self.no_role_since: dict[str, float] = {}
        self.retried = 0
        self.counted: dict[int, set[int]] = {}  # engine id -> pids whose death was counted

    # ------------------------------------------------------------------ messages
    def supervised(self, now: float) -> bool:
        return now - self.report_s < SUPERVISED_S

    def on_report(self, msg: Supervision, now: float) -> None:
        """A supervisor report: an engine process it saw exit is dead now (not after the
        heartbeat timeout), if it is the process that registered (pid), not its restarted self;
        one that exited before registering is a death too."""
        self.report, self.report_s = msg, now
        for eid, pid in msg.lost.items():
            e = self.svc.state.engines.get(eid)
            if e is not None and e.alive and self.pids.get(eid) == pid:
                self.svc.engine_died(
                    eid, f"{engine_name(e.role, eid)} exited (pid {pid}); the supervisor restarts it"
                )
        from dualpath.runtime.cluster.sched_guard import process_runs

        for eid, pids in msg.exited.items():
            for pid in pids:
                if not process_runs(pid):  # (a report naming a live process is no death)
                    self.count_death(eid, pid)

    def count_death(self, eid: int, pid: int) -> bool:
        """Count the death of process ``pid`` of engine ``eid`` once; True if it was new."""
        seen = self.counted.setdefault(eid, set())
        if pid in seen:
            return False
        seen.add(pid)
        if len(seen) > COUNTED_PIDS:
            seen.discard(min(seen))
        self.svc.report.deaths += 1
        return True

    def is_lost(self, eid: int) -> bool:
        """The supervisor saw the process registered as ``eid`` exit (a late heartbeat of it must
        not revive it)."""
        r = self.report
        return r is not None and r.lost.get(eid, -1) == self.pids.get(eid)

    def on_loading(self, msg: EngineLoading, now: float) -> None:
        """An engine loading; one that registered already (its pid) and still builds its worker
        is alive: this counts as its heartbeat."""
        for eid, pid in self.pids.items():
            e = self.svc.state.engines.get(eid)
            if pid == msg.pid and e is not None and e.alive:
                e.last_seen_s = now
                return
        name = self._loading_name(msg.role, msg.engine_id, msg.node_id, msg.pid)
        old = self.loading.get(name)
        since = old.since_unix_s if old is not None and old.pid == msg.pid else time.time()
        self.loading[name] = Loading(msg, now, since)

    @staticmethod
    def _loading_name(role: str, eid: int, node_id: int, pid: int) -> str:
        return engine_name(role, eid) if eid >= 0 else f"{role} engine (node {node_id}, pid {pid})"

    def on_hello(self, msg: EngineHello) -> None:
        """Before registering: a hello with the id of a live engine of the same role and node but
        another pid is that engine restarted (its old process is gone): the old one dies first."""
        self.loading.pop(self._loading_name(msg.role, msg.engine_id, msg.node_id, msg.pid), None)
        e = self.svc.state.engines.get(msg.engine_id)
        old = self.pids.get(msg.engine_id)
        if (
            e is not None
            and e.alive
            and e.role == msg.role
            and e.node_id == msg.node_id
            and old is not None
            and old != msg.pid
        ):
            self.svc.engine_died(
                e.engine_id, f"{engine_name(e.role, e.engine_id)} restarted (pid {old} -> {msg.pid})"
            )

    def registered(self, eid: int, pid: int) -> None:
        self.pids[eid] = pid
        for d in (self.dead_since, self.dead_reason, self.dead_mono, self.asked):
            d.pop(eid, None)
        self.started_unix[eid] = time.time()

    def unknown_heartbeat(self, ident: bytes, msg: Heartbeat, now: float) -> None:
        """A heartbeat of an engine this scheduler does not know: it registered with an earlier
        scheduler process. Ask it (on its heartbeat socket) to register again."""
        if now - self.asked.get(msg.engine_id, float("-inf")) < REREGISTER_EVERY_S:
            return
        self.asked[msg.engine_id] = now
        self.svc.drops.drop(
            "control", "unknown_engine", f"heartbeat of engine {msg.engine_id}; asked to register again"
        )
        self.svc._send(ident, Reset(reason="register again"))

    # ------------------------------------------------------------------ deaths
    def died(self, eid: int, reason: str) -> None:
        """Engine ``eid`` was declared dead (its process, ``pids[eid]``, counted once)."""
        self.dead_since.setdefault(eid, time.time())
        self.dead_mono.setdefault(eid, time.monotonic())
        self.dead_reason[eid] = reason
        self.count_death(eid, self.pids.get(eid, -1))

    def revived(self, eid: int) -> None:
        for d in (self.dead_since, self.dead_reason, self.dead_mono):
            d.pop(eid, None)

    def given_up(self, name: str) -> bool:
        """The supervisor no longer restarts ``name`` (its restart budget is used up)."""
        return self.report is not None and name in self.report.given_up

    def restarting(self, name: str, now: float) -> float | None:
        """Since when (Unix s) the supervisor has been restarting ``name``; None if it is not."""
        r = self.report
        if r is None or not self.supervised(now):
            return None
        return r.down.get(name)

    def coming_back(self, role: str, now: float) -> bool:
        """A supervisor reports, and an engine of ``role`` is on its way back: registered but not
        routable (dead, restarting, loading or starting; not given up), or heard loading. Requests
        for the role then wait (``orphans`` bounds the wait) instead of being refused."""
        if not self.supervised(now):
            return False
        for e in self.svc.state.engines.values():
            if (
                e.role == role
                and not (e.alive and e.ready)
                and not self.given_up(engine_name(role, e.engine_id))
            ):
                return True
        return any(ld.role == role for ld in self.loading.values())

    def orphans(self, now: float) -> None:
        """End requests that need a role with no live engine: prefill for those not prefilled yet,
        decode for all; at once without a supervisor, after ``ORPHAN_WAIT_S`` with one."""
        svc = self.svc
        for role in ("prefill", "decode"):
            if svc.state.groups(role) or not svc.state.requests:
                self.no_role_since.pop(role, None)
                continue
            since = self.no_role_since.setdefault(role, now)
            if self.supervised(now) and now - since < ORPHAN_WAIT_S:
                continue
            for rid, req in list(svc.state.requests.items()):
                if role == "decode" or not req.pe_done:
                    svc._fail(rid, f"no live {role} engine left (for {now - since:.0f} s)")

    def forget_left(self, now: float) -> None:
        """Remove engines dead for ``left_grace_s`` that nobody restarts or loads (they left)."""
        grace = self.svc.args.cluster.scheduler.left_grace_s
        for eid, dead_s in list(self.dead_mono.items()):
            e = self.svc.state.engines.get(eid)
            if e is None or e.alive or now - dead_s < grace:
                continue
            name = engine_name(e.role, eid)
            if name in self.loading or self.restarting(name, now) is not None or self.given_up(name):
                continue
            self.svc.state.remove_engine(eid)
            for d in (self.pids, self.dead_since, self.dead_reason, self.dead_mono, self.started_unix):
                d.pop(eid, None)
            print(
                f"scheduler: {name} left (dead for {now - dead_s:.0f} s, not restarted); removed", flush=True
            )

    def restarts(self) -> dict[str, int]:
        return dict(self.report.restarts) if self.report is not None else {}

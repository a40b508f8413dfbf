"""The scheduler's side of process supervision (see runtime/cluster/supervisor.py for the other).

What the scheduler service knows about its engines as processes: the pid each registered with, the
engines still loading (``EngineLoading`` from their heartbeat thread), when each was declared dead
(wall clock, for ``/health``), the supervisor's last ``Supervision`` report (restart counts, engine
processes seen exiting). It also asks engines it does not know (a scheduler restart forgot them) to
register again, and ends requests that wait for a role with no live engine: at once when no
supervisor reports, after ``ORPHAN_WAIT_S`` (the restarted engine did not come back) otherwise.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from dualpath.runtime.cluster.api import DownItem
from dualpath.runtime.cluster.messages import EngineHello, EngineLoading, Heartbeat, Reset, Supervision

if TYPE_CHECKING:
    from dualpath.runtime.cluster.scheduler import SchedulerService

LOADING_TTL_S = 10.0  # a loading engine not heard of for this long is no longer listed
SUPERVISED_S = 5.0  # a supervisor report this recent: lost engines come back (requests wait)
ORPHAN_WAIT_S = 30.0  # with a supervisor: how long requests wait for a role with no live engine
REREGISTER_EVERY_S = 1.0  # how often an unknown engine is asked to register again


def engine_name(role: str, engine_id: int) -> str:
    return f"{role} engine {engine_id}"


class SupervisionView:
    def __init__(self, svc: SchedulerService) -> None:
        self.svc = svc
        self.pids: dict[int, int] = {}  # engine id -> pid it registered with
        self.dead_since: dict[int, float] = {}  # engine id -> Unix time it was declared dead
        self.loading: dict[str, tuple[float, float]] = {}  # name -> (since Unix s, last heard, monotonic)
        self.report: Supervision | None = None
        self.report_s = float("-inf")
        self.asked: dict[int, float] = {}  # engine id -> when last asked to register again
        self.no_role_since: dict[str, float] = {}
        self.retried = 0

    # ------------------------------------------------------------------ messages
    def supervised(self, now: float) -> bool:
        return now - self.report_s < SUPERVISED_S

    def on_report(self, msg: Supervision, now: float) -> None:
        """A supervisor report: an engine process it saw exit is dead now (not after the
        heartbeat timeout), if it is the process that registered (pid), not its restarted self."""
        self.report, self.report_s = msg, now
        for eid, pid in msg.lost.items():
            e = self.svc.state.engines.get(eid)
            if e is not None and e.alive and self.pids.get(eid) == pid:
                self.svc.engine_died(
                    eid, f"{engine_name(e.role, eid)} exited (pid {pid}); the supervisor restarts it"
                )

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
        since = self.loading.get(name, (time.time(), now))[0]
        self.loading[name] = (since, now)

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
        self.dead_since.pop(eid, None)
        self.asked.pop(eid, None)

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
    def died(self, eid: int) -> None:
        self.dead_since.setdefault(eid, time.time())

    def revived(self, eid: int) -> None:
        self.dead_since.pop(eid, None)

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

    # ------------------------------------------------------------------ reports
    def items(self) -> tuple[DownItem, ...]:
        """What is down now: dead engines, engines the supervisor is restarting, loading ones."""
        now_unix, now = time.time(), time.monotonic()
        out: dict[str, DownItem] = {}
        for e in self.svc.state.engines.values():
            if not e.alive:
                name = engine_name(e.role, e.engine_id)
                out[name] = DownItem(
                    what=name, state="dead", since_unix_s=self.dead_since.get(e.engine_id, now_unix)
                )
        alive = {engine_name(e.role, e.engine_id) for e in self.svc.state.engines.values() if e.alive}
        if self.report is not None and self.supervised(now):
            for name, since in self.report.down.items():
                if name not in alive:
                    out[name] = DownItem(
                        what=name,
                        state="restarting",
                        since_unix_s=min(since, out[name].since_unix_s) if name in out else since,
                    )
        for name, (since, heard) in list(self.loading.items()):
            if now - heard > LOADING_TTL_S:
                del self.loading[name]
            elif name not in alive:
                first = out[name].since_unix_s if name in out else since
                out[name] = DownItem(what=name, state="loading", since_unix_s=min(first, since))
        return tuple(out[k] for k in sorted(out))

    def restarts(self) -> dict[str, int]:
        return dict(self.report.restarts) if self.report is not None else {}

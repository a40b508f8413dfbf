"""``/health``'s view of the engines: one entry per engine, its current process and state.

An engine id is listed once, with the process that is it now: registered and routable ("ready"),
registered and still building its caches ("starting"), a process loading under that id
("loading": a restart, or the first start), being restarted by the supervisor ("restarting"), or
declared dead ("dead"), or given up on by the supervisor ("failed"). ``unavailable`` lists every entry not ready with the time it entered that
state. History (earlier deaths, revivals) is in the logs and the metrics, not here.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from dualpath.runtime.cluster.api import DownItem, EngineHealth
from dualpath.runtime.cluster.supervisor_view import LOADING_TTL_S, engine_name

if TYPE_CHECKING:
    from dualpath.runtime.cluster.scheduler import SchedulerService


def engine_entries(
    svc: SchedulerService,
) -> tuple[tuple[EngineHealth, ...], tuple[DownItem, ...], tuple[str, ...]]:
    """(one ``EngineHealth`` per engine, what is not ready now, why each not-ready one is down)."""
    sv, now, now_unix = svc.supervision, time.monotonic(), time.time()
    loads = svc.state.ledger.engines
    rs = sv.report.engine_restarts if sv.report is not None else {}
    for name, ld in list(sv.loading.items()):
        if now - ld.heard_s > LOADING_TTL_S:
            del sv.loading[name]
    entries: dict[str, EngineHealth] = {}
    down: dict[str, DownItem] = {}
    why: dict[str, str] = {}
    for e in svc.state.engines.values():
        name, load = engine_name(e.role, e.engine_id), loads.get(e.engine_id)
        state, since, pid, gen = "ready", 0.0, e.pid, e.generation
        if e.alive and not e.ready:
            state, since = "starting", sv.started_unix.get(e.engine_id, now_unix)
        elif not e.alive:
            ld, restarting = sv.loading.get(name), sv.restarting(name, now)
            if ld is not None and ld.pid != e.pid:
                state, since, pid, gen = "loading", ld.since_unix_s, ld.pid, ld.generation
            elif sv.given_up(name):
                state, since = "failed", sv.dead_since.get(e.engine_id, now_unix)
            elif restarting is not None:
                state, since = "restarting", restarting
            else:
                state, since = "dead", sv.dead_since.get(e.engine_id, now_unix)
            told = sv.report.why.get(name) if sv.report is not None else None
            why[name] = (
                told
                if state in ("restarting", "failed") and told
                else sv.dead_reason.get(e.engine_id, f"{name} {state}")
            )
        entries[name] = EngineHealth(
            engine_id=e.engine_id, role=e.role, node_id=e.node_id, alive=state == "ready",
            num_seqs=load.num_seqs if load else 0, num_tokens=load.num_tokens if load else 0,
            last_seen_s=e.last_seen_s, data_addr=e.data_addr, state=state, pid=pid, generation=gen,
            restarts=rs.get(e.engine_id, 0), weights_bytes=e.weights_bytes, kv_pool_bytes=e.kv_pool_bytes,
            rss_bytes=e.rss_bytes, max_prompt_tokens=e.max_prompt_tokens, max_context_tokens=e.max_context_tokens,
        )  # fmt: skip
        if state != "ready":
            down[name] = DownItem(what=name, state=state, since_unix_s=since)  # type: ignore[arg-type]
    for name, ld in sv.loading.items():  # (first start, or its id was forgotten)
        if name not in entries:
            entries[name] = EngineHealth(
                engine_id=ld.eid, role=ld.role, node_id=ld.node_id, alive=False, num_seqs=0,
                num_tokens=0, last_seen_s=ld.heard_s, state="loading", pid=ld.pid,
                generation=ld.generation, restarts=rs.get(ld.eid, 0),
            )  # fmt: skip
            down[name] = DownItem(what=name, state="loading", since_unix_s=ld.since_unix_s)
            why[name] = f"{name} loading"
    if sv.report is not None and sv.supervised(now):
        for name, since in sv.report.down.items():  # (the scheduler, an engine never registered)
            if name not in entries and name not in down:
                down[name] = DownItem(what=name, state="restarting", since_unix_s=since)
                why[name] = sv.report.why.get(name, f"{name} restarting")
    order = sorted(entries.values(), key=lambda h: (h.engine_id, h.role))
    return tuple(order), tuple(down[k] for k in sorted(down)), tuple(why[k] for k in sorted(why))

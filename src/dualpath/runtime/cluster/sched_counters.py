"""Cluster counters summed from engines' heartbeats that never go backwards.

Each engine reports cumulative counters since its process started (bytes per KV path and per NIC,
its store's counters, dropped messages, requests it failed alone). Summing each engine's latest
heartbeat, as the scheduler once did, drops when an engine restarts (its new process counts from
zero) or dies: a demo run across a decode engine's OOM restart printed ``persist (MB) -32.44``.
``EngineTotals`` adds each heartbeat's increase over the same process's previous one instead: a
new process of an engine (another pid) or a value below the previous one (a restart the pid did
not show) counts from zero. Totals of engines that left stay. ``state``/``load`` carry the totals
and each engine's last values across a scheduler restart (``sched_persist``), so the engines'
first heartbeats to the new scheduler add only what is new.
"""

from __future__ import annotations

from typing import Any

from dualpath.runtime.cluster.messages import Heartbeat

GROUPS = ("bytes_by_path", "bytes_by_nic", "store_counts", "store_write_errors", "dropped")


class EngineTotals:
    def __init__(self) -> None:
        self.totals: dict[str, dict[str, int]] = {g: {} for g in (*GROUPS, "failed_requests")}
        self._last: dict[int, tuple[int, dict[str, dict[str, int]]]] = {}  # engine -> (pid, values)

    def add(self, hb: Heartbeat, pid: int) -> None:
        """Count what ``hb`` (of engine process ``pid``) adds over its previous heartbeat."""
        seen_pid, seen = self._last.get(hb.engine_id, (pid, {}))
        if seen_pid != pid:
            seen = {}
        now = {g: dict(getattr(hb, g)) for g in GROUPS} | {"failed_requests": {"": hb.failed_requests}}
        for group, values in now.items():
            before, total = seen.get(group, {}), self.totals[group]
            for key, value in values.items():
                prev = before.get(key, 0)
                total[key] = total.get(key, 0) + (value - prev if value >= prev else value)
        self._last[hb.engine_id] = (pid, now)

    def group(self, name: str) -> dict[str, int]:
        return dict(self.totals[name])

    @property
    def failed_requests(self) -> int:
        return self.totals["failed_requests"].get("", 0)

    def state(self) -> dict[str, Any]:
        """JSON-able totals and last values (``load`` takes them back)."""
        return {"totals": self.totals, "last": {str(e): [p, v] for e, (p, v) in self._last.items()}}

    def load(self, data: dict[str, Any]) -> None:
        for group, values in data.get("totals", {}).items():
            if group in self.totals:
                self.totals[group] = {str(k): int(v) for k, v in values.items()}
        for eid, (pid, values) in data.get("last", {}).items():
            self._last[int(eid)] = (int(pid), {g: dict(v) for g, v in values.items()})

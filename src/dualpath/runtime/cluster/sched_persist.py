"""What the scheduler keeps across its own restarts: the operator settings (``Configure``) and the
cluster counters, in one JSON file (``SchedulerArgs.state_file``, the run directory of a local
cluster), written atomically when a setting changes and at most every ``SAVE_EVERY_S`` while
counters move, read back when a restarted scheduler starts. A missing or unreadable file starts
from the configuration and zero counters (logged).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

SAVE_EVERY_S = 0.5  # counters lost to a scheduler crash: at most this much of their history
VERSION = 1


class StateFile:
    def __init__(self, path: str) -> None:
        self.path = Path(path) if path else None
        self._saved_s = float("-inf")
        self._last: str = ""

    def load(self) -> dict[str, Any]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") != VERSION:
                raise ValueError(f"version {data.get('version')!r}")
        except (OSError, ValueError) as exc:
            print(f"scheduler: state file {self.path} unreadable ({exc}); starting afresh", file=sys.stderr)
            return {}
        print(f"scheduler: restored settings and counters from {self.path}", flush=True)
        return dict(data)

    def save(self, data: dict[str, Any], now: float, *, force: bool = False) -> None:
        """Write ``data`` if it changed (at most every ``SAVE_EVERY_S`` unless ``force``)."""
        if self.path is None or (not force and now - self._saved_s < SAVE_EVERY_S):
            return
        text = json.dumps({"version": VERSION, **data}, sort_keys=True)
        if text == self._last:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            tmp.write_text(text)
            os.replace(tmp, self.path)
        except OSError as exc:  # (a full disk must not stop the scheduler)
            print(f"scheduler: cannot write {self.path}: {exc}", file=sys.stderr)
            return
        self._saved_s, self._last = now, text


def snapshot(core: Any) -> dict[str, Any]:
    """What ``restore`` takes back: settings, the reporter's counters, deaths counted per pid."""
    c, r, sv = core.args.cluster, core.report, core.supervision
    return {
        "settings": {"policy": c.policy, "read_free": c.traffic.read_free, "snic_gbps": c.traffic.snic_gbps},
        "counts": dict(r.counts),
        "deaths": r.deaths,
        "revivals": r.revivals,
        "retried": sv.retried,
        "counted": {str(k): sorted(v) for k, v in sv.counted.items()},
        "engine_totals": r.engine_totals.state(),
    }


def restore(core: Any, data: dict[str, Any]) -> None:
    """Apply a ``snapshot`` to a starting scheduler core (settings before any engine registers)."""
    import msgspec

    from dualpath.runtime.cluster.messages import Configure
    from dualpath.runtime.cluster.sched_registry import configured

    s = data.get("settings")
    if s:
        msg = Configure(query_id=0, policy=s["policy"], read_free=s["read_free"], snic_gbps=s["snic_gbps"],
                        reset=() if s["snic_gbps"] is not None else ("snic_gbps",))  # fmt: skip
        core.args = msgspec.structs.replace(core.args, cluster=configured(core.args.cluster, msg))
    r, sv = core.report, core.supervision
    for k, v in data.get("counts", {}).items():
        if k in r.counts:
            r.counts[k] = int(v)
    r.deaths, r.revivals = int(data.get("deaths", 0)), int(data.get("revivals", 0))
    sv.retried = int(data.get("retried", 0))
    sv.counted = {int(k): set(v) for k, v in data.get("counted", {}).items()}
    r.engine_totals.load(data.get("engine_totals", {}))

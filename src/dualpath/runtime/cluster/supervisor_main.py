"""The supervisor process of a local cluster: ``python -m dualpath.runtime.cluster.supervisor_main
'<SupervisorArgs as JSON>'``, started by ``LocalCluster`` (so by ``dualpath serve``), dying with it (its children die with it).

It starts the scheduler and the engines (``local_procs.py``), then runs the ``Supervisor`` loop in
its main thread until SIGTERM, then stops them. What the process that started it needs (the
scheduler's address, each process's pid, the restart counts, the latest events, an error during
start) it writes to ``status.json`` in the run directory, atomically, whenever it changes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from dualpath.runtime.cluster.config import ClusterConfig
from dualpath.runtime.cluster.local_procs import ClusterProcesses
from dualpath.runtime.cluster.supervisor import Supervisor
from dualpath.runtime.transfer.auth import load_keys


class SupervisorArgs(msgspec.Struct, frozen=True, kw_only=True):
    cluster: ClusterConfig  # the scheduler's
    engine_cluster: ClusterConfig  # the engines' (tiny model folder, KV budget in bytes)
    run_dir: str
    cluster_id: str
    key_file: str = ""
    kv_capacity_bytes: int = 0
    supervise: bool = True
    startup_timeout_s: float = 180.0
    restarts: dict[str, int] = msgspec.field(default_factory=dict)  # counts carried from a predecessor
    engine_restarts: dict[int, int] = msgspec.field(default_factory=dict)


class StatusFile:
    """``status.json``: state ("starting", "ready", "error", "stopped"), address, pids, restarts,
    events; rewritten (atomically) only when it changed."""

    def __init__(self, path: Path) -> None:
        self.path, self._last = path, ""
        self.data: dict[str, Any] = {"state": "starting", "supervisor_pid": os.getpid()}
        self.update()

    def update(self, **fields: Any) -> None:
        self.data.update(fields)
        text = json.dumps(self.data, sort_keys=True)
        if text == self._last:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)
        self._last = text

    def write(self, sup: Supervisor) -> None:
        self.update(
            pids=sup.procs.pids(),
            restarts=dict(sup.restarts),
            engine_restarts={str(k): v for k, v in sup.engine_restarts.items()},
            events=sup.events[-100:],
            unhealthy=sup.unhealthy,
            standby=[{"pid": sb.proc.pid, "warm": sb.warm} for sb in sup.procs.standbys],
        )


PARENT_CHECK_S = 0.5  # how often the supervisor checks that the process that started it lives


def _die_with_parent() -> None:
    """SIGTERM to this process once its parent is gone (``PR_SET_PDEATHSIG`` would follow the
    parent's *thread*: a cluster started from a worker thread would stop when that thread ends)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="dualpath-parent-watch").start()


def main() -> None:
    _die_with_parent()
    args = msgspec.json.decode(sys.argv[1].encode(), type=SupervisorArgs)
    run_dir = Path(args.run_dir)
    status = StatusFile(run_dir / "status.json")
    procs = ClusterProcesses(
        cluster=args.cluster,
        engine_cluster=args.engine_cluster,
        run_dir=run_dir,
        cluster_id=args.cluster_id,
        key_file=args.key_file,
        keys=load_keys(args.key_file),
        kv_capacity_bytes=args.kv_capacity_bytes,
    )
    sup: Supervisor | None = None

    def stop(*_: object) -> None:
        if sup is not None:
            sup.stopping.set()
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        procs.start(args.startup_timeout_s)
        sup = Supervisor(procs, args.cluster.supervisor, status)
        sup.restarts.update(args.restarts)  # (a restarted supervisor goes on counting)
        sup.engine_restarts.update(args.engine_restarts)
        status.update(state="ready", address=procs.address, pids=procs.pids())
        sup.run(supervise=args.supervise)
        status.update(state="stopped")
    except KeyboardInterrupt:
        status.update(state="stopped")
    except Exception as exc:  # noqa: BLE001 - reported to the parent through the status file
        status.update(state="error", error=str(exc), address=procs.address)
        print(f"supervisor: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    finally:
        procs.stop()


if __name__ == "__main__":
    main()

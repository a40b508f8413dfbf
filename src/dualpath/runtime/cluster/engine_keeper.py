"""``dualpath engine --restart-on-exit``: keep one remote engine running (an engine on another host
has no ``LocalCluster`` supervisor).

The keeper is a small parent process: it runs the engine as its child
(``python -m dualpath.runtime.cluster.engine_main``), and whenever the child exits, however it
ended (a crash, kill -9, the kernel's OOM killer, or a clean exit after the scheduler's
``Shutdown``), logs how and starts it again after a backoff: ``first_backoff_s`` (0.5 s),
doubling while the engine keeps dying within ``stable_s`` (30 s) of its start, at most
``max_backoff_s`` (10 s), at least ``oom_backoff_s`` (5 s) after an OOM kill: the supervisor's rule (``supervisor.backoff_s``, the defaults of
``SupervisorConfig``). The restarted engine keeps the engine id the scheduler gave the first one
(the child writes it to an id file) and is the next generation of it, so the scheduler registers
it as that engine restarted. More than ``restart_burst`` restarts within ``restart_interval_s``
and the keeper gives up (exit 1), as systemd's ``StartLimitBurst`` does. SIGTERM / SIGINT stop
the child and the keeper (no restart); the child dies with the keeper (``PR_SET_PDEATHSIG``).
The engine's own re-registration with a restarted scheduler (``engine_loop.Reregister``) needs
no restart: an engine outlives its scheduler.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from dualpath.runtime.cluster.config import EngineArgs, SupervisorConfig
from dualpath.runtime.cluster.oom import OomWatch, exit_text
from dualpath.runtime.cluster.supervisor import backoff_s


def _die_with_parent() -> None:
    from dualpath.runtime.cluster.local_procs import die_with_parent

    die_with_parent()


class EngineKeeper:
    """Runs ``args``'s engine and restarts it on exit (module docstring)."""

    def __init__(self, args: EngineArgs, sup: SupervisorConfig | None = None) -> None:
        self.sup = sup or SupervisorConfig()
        self.id_file = Path(tempfile.mkdtemp(prefix="dualpath-keeper-")) / "engine_id"
        self.args = msgspec.structs.replace(args, id_file=str(self.id_file))
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.restarts: list[float] = []  # monotonic start times of restarts (the burst window)

    def _say(self, text: str) -> None:
        print(f"engine keeper (pid {os.getpid()}): {text}", flush=True)

    def _stop(self, signum: int, _frame: object) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def _spawn(self) -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable,
            "-m",
            "dualpath.runtime.cluster.engine_main",
            msgspec.json.encode(self.args).decode(),
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)

    def _next_args(self) -> None:
        """The restarted engine: the id the scheduler gave the first one, the next generation."""
        eid = self.args.engine_id
        try:
            eid = int(self.id_file.read_text())
        except (OSError, ValueError):
            pass  # (it never registered: the scheduler picks again)
        self.args = msgspec.structs.replace(self.args, engine_id=eid, generation=self.args.generation + 1)

    def run(self) -> int:
        """Until stopped (0) or the restart budget is spent (1)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        failures = 0
        while True:
            started = time.monotonic()
            self.child = self._spawn()
            oom = OomWatch.of(self.child.pid)
            self._say(f"engine started (pid {self.child.pid}, generation {self.args.generation})")
            rc = self.child.wait()
            oomed = oom.verdict(rc)
            how = exit_text(rc) + (f"; {oomed}" if oomed else "")
            if self.stopping:
                self._say(f"engine (pid {self.child.pid}) {how}; stopped")
                return 0
            now = time.monotonic()
            failures = failures + 1 if now - started < self.sup.stable_s else 1
            self.restarts = [t for t in self.restarts if now - t < self.sup.restart_interval_s]
            if len(self.restarts) >= self.sup.restart_burst:
                self._say(
                    f"engine (pid {self.child.pid}) {how}; restarted {len(self.restarts)} times "
                    f"within {self.sup.restart_interval_s:g} s (the restart burst): not restarted again"
                )
                return 1
            wait = backoff_s(failures, self.sup.first_backoff_s, self.sup.max_backoff_s)
            wait = max(wait, self.sup.oom_backoff_s) if oomed else wait
            self._say(f"engine (pid {self.child.pid}) {how}; restarting in {wait:g} s")
            time.sleep(wait)
            if self.stopping:
                return 0
            self.restarts.append(time.monotonic())
            self._next_args()


def keep_running(args: EngineArgs, sup: SupervisorConfig | None = None) -> int:
    """Run the engine of ``args`` under a keeper; its exit status."""
    import shutil

    keeper = EngineKeeper(args, sup)
    try:
        return keeper.run()
    finally:
        shutil.rmtree(keeper.id_file.parent, ignore_errors=True)

"""LocalCluster's processes: each started as ``python -m <module> '<args as JSON>'`` with its log
in the run directory (and SIGTERM when this process dies), the warm standby engine a restarted
engine can become, the current process of a name, respawning one with its first arguments,
signals, liveness and log tails. ``LocalCluster`` (``local.py``) inherits it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import msgspec

from dualpath.core.errors import DualpathError


def _load_prctl() -> object:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # loaded here, not in the forked child (the supervisor thread forks too)


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM when the process that started it dies (no orphans)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # type: ignore[operator]  # PR_SET_PDEATHSIG


class ClusterProcesses:
    """Needs the cluster's ``run_dir``, ``standby``, ``scheduler_proc``, ``engine_procs`` and the
    spawn bookkeeping (``_spawn_args``, ``_standby``, ``_standbys``)."""

    run_dir: Path
    standby: bool
    scheduler_proc: subprocess.Popen[bytes] | None
    engine_procs: dict[int, subprocess.Popen[bytes]]
    _spawn_args: dict[str, tuple[str, msgspec.Struct, str]]
    _standby: subprocess.Popen[bytes] | None
    _standbys: int

    def _spawn(
        self, module: str, args: msgspec.Struct, log: str, name: str = "", flags: tuple[str, ...] = ()
    ) -> subprocess.Popen[bytes]:
        if name:
            self._spawn_args[name] = (module, args, log)
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        with open(self.run_dir / log, "ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", module, *flags, msgspec.json.encode(args).decode()],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                stdin=subprocess.PIPE if flags else subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )

    def _new_standby(self) -> None:
        """Start the warm spare (its template: engine 0's arguments; same model for all)."""
        module, args, _ = self._spawn_args["engine0"]
        self._standbys += 1
        self._standby = self._spawn(module, args, f"standby{self._standbys}.log", flags=("--standby",))

    def _take_standby(self, name: str) -> subprocess.Popen[bytes] | None:
        """Hand engine ``name``'s arguments to the spare (then start the next one); None if none."""
        proc, self._standby = self._standby, None
        if proc is None or proc.poll() is not None or proc.stdin is None:
            return None
        _, args, log = self._spawn_args[name]
        try:
            proc.stdin.write(msgspec.json.encode([args, str(self.run_dir / log)]) + b"\n")
            proc.stdin.close()
        except OSError:
            return None
        return proc

    def proc(self, name: str) -> subprocess.Popen[bytes]:
        """The current process of ``name`` ("scheduler" or "engine<id>")."""
        if name == "scheduler":
            assert self.scheduler_proc is not None
            return self.scheduler_proc
        return self.engine_procs[int(name.removeprefix("engine"))]

    def respawn(self, name: str) -> subprocess.Popen[bytes]:
        """Start ``name`` again with the arguments it first had (the scheduler on the same
        address; an engine under the same id); its log is appended to."""
        proc = self._take_standby(name) if self.standby and name != "scheduler" else None
        if proc is not None:
            self._new_standby()
        else:
            proc = self._spawn(*self._spawn_args[name])
        if name == "scheduler":
            self.scheduler_proc = proc
        else:
            self.engine_procs[int(name.removeprefix("engine"))] = proc
        return proc

    def signal(self, name: str, sig: int) -> int:
        """Send ``sig`` to the process of ``name`` (fault tests, the chaos benchmark); its pid."""
        proc = self.proc(name)
        proc.send_signal(sig)
        return proc.pid

    def log_tails(self, chars: int = 3000) -> str:
        """The end of each process's log, with each process's state (exit code or running)."""
        procs = {"scheduler": self.scheduler_proc} | {f"engine{e}": p for e, p in self.engine_procs.items()}
        parts = []
        for name, proc in procs.items():
            state = (
                "not started"
                if proc is None
                else ("running" if proc.poll() is None else f"exited with code {proc.returncode}")
            )
            log = self.run_dir / f"{name}.log"
            text = log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"
            parts.append(f"--- {name} ({state}) {log}\n{text}")
        return "\n".join(parts)

    def _check_alive(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is not None:
            log = self.run_dir / ("scheduler.log" if name == "scheduler" else f"{name}.log")
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise DualpathError(f"{name} exited with code {proc.returncode}; log {log}:\n{tail}")

    def kill_engine(self, engine_id: int) -> None:
        """SIGKILL one engine process (failure tests)."""
        proc = self.engine_procs[engine_id]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

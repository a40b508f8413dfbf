"""A local cluster's processes, owned by its supervisor process (``supervisor_main.py``): each
started as ``python -m <module> '<args as JSON>'`` with its log in the run directory (and SIGTERM
when the supervisor dies); the cluster's start (the scheduler, then every engine, until each is
ready); the warm standbys (``--standby N``: only a spare that says its model is loaded is handed
out); the current process of a name; respawning one as a new generation of its engine id.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import zmq

from dualpath.core.errors import DualpathError
from dualpath.runtime.cluster.api import ClusterHealth
from dualpath.runtime.cluster.config import ClusterConfig, EngineArgs, SchedulerArgs
from dualpath.runtime.cluster.messages import Query, QueryReply, decode, encode
from dualpath.runtime.transfer.auth import ClusterKeys


def _load_prctl() -> object:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # loaded here, not in the forked child


def die_with_parent() -> None:
    """Linux: the child gets SIGTERM when the thread that started it ends (the supervisor starts
    its children from its main thread only, so: when the supervisor dies; no orphans)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM)  # type: ignore[operator]  # PR_SET_PDEATHSIG


def query_health(address: str, keys: ClusterKeys | None, timeout_s: float = 2.0) -> ClusterHealth | None:
    """One synchronous health query to the scheduler at ``address``; None if no answer."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        keys.client(sock)
    try:
        sock.connect(address)
        sock.send_multipart([b"", encode(Query(query_id=1, what="health"))])
        if not sock.poll(int(timeout_s * 1000)):
            return None
        reply = decode(sock.recv_multipart()[-1])
        return reply.health if isinstance(reply, QueryReply) else None
    finally:
        sock.close(0)


@dataclass(slots=True, kw_only=True)
class Standby:
    proc: subprocess.Popen[bytes]
    warm_file: Path
    started_s: float = field(default_factory=time.monotonic)

    @property
    def warm(self) -> bool:
        """Its model is loaded (it says so with its warm file) and it runs."""
        return self.proc.poll() is None and self.warm_file.exists()


class ClusterProcesses:
    """The processes of one local cluster; see the module docstring. ``cluster``: the scheduler's
    config; ``engine_cluster``: the engines' (the tiny model's folder, the KV budget in bytes)."""

    def __init__(
        self,
        *,
        cluster: ClusterConfig,
        engine_cluster: ClusterConfig,
        run_dir: Path,
        cluster_id: str,
        key_file: str,
        keys: ClusterKeys | None,
        kv_capacity_bytes: int,
    ) -> None:
        self.config, self.engine_config = cluster, engine_cluster
        self.run_dir, self.cluster_id, self.key_file, self.keys = run_dir, cluster_id, key_file, keys
        self.kv_capacity_bytes = kv_capacity_bytes
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.spawn_args: dict[str, tuple[str, EngineArgs | SchedulerArgs, str]] = {}
        self.standbys: list[Standby] = []
        self.num_standbys = 0
        self.address = ""

    # ------------------------------------------------------------------ spawning
    def spawn(
        self,
        module: str,
        args: msgspec.Struct,
        log: str,
        flags: tuple[str, ...] = (),
        tail: tuple[str, ...] = (),
    ) -> subprocess.Popen[bytes]:
        """``python -m module *flags '<args as JSON>' *tail``, output appended to ``log``."""
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        with open(self.run_dir / log, "ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", module, *flags, msgspec.json.encode(args).decode(), *tail],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                stdin=subprocess.PIPE if "--standby" in flags else subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )

    def engine_args(self, eid: int, generation: int = 0) -> EngineArgs:
        cfg = self.config
        writer_cap = self.kv_capacity_bytes // cfg.num_decode_engines  # DEs persist: 1/D each
        return EngineArgs(
            cluster=self.engine_config,
            scheduler=self.address,
            role=cfg.role_of(eid),
            node_id=cfg.node_of(eid),
            engine_id=eid,
            cluster_id=self.cluster_id,
            kv_capacity_bytes=writer_cap if cfg.role_of(eid) == "decode" else self.kv_capacity_bytes,
            key_file=self.key_file,
            weights_dir=str(self.run_dir),  # one mapped copy of the weights for the host
            generation=generation,
        )

    def start(self, timeout_s: float) -> None:
        """The scheduler, then every engine; returns once every engine is ready (DualpathError
        naming the process and its log tail if one exits meanwhile, or on timeout)."""
        port_file = self.run_dir / "scheduler.addr"
        sargs = SchedulerArgs(
            cluster=self.config,
            port_file=str(port_file),
            kv_capacity_bytes=self.kv_capacity_bytes,
            key_file=self.key_file,
            state_file=str(self.run_dir / "scheduler.state"),
            supervised=True,
        )
        self.procs["scheduler"] = self.spawn("dualpath.runtime.cluster.scheduler", sargs, "scheduler.log")
        deadline = time.monotonic() + 30
        while not port_file.exists():
            self.check_alive("scheduler")
            if time.monotonic() > deadline:
                raise DualpathError(f"scheduler did not start; see {self.run_dir / 'scheduler.log'}")
            time.sleep(0.05)
        self.address = port_file.read_text().strip()
        bound = msgspec.structs.replace(self.config, scheduler_port=int(self.address.rsplit(":", 1)[1]))
        self.spawn_args["scheduler"] = (
            "dualpath.runtime.cluster.scheduler",
            msgspec.structs.replace(sargs, cluster=bound),  # (a restart: same address)
            "scheduler.log",
        )
        for eid in range(self.config.num_engines):
            args = self.engine_args(eid)
            self.spawn_args[f"engine{eid}"] = (
                "dualpath.runtime.cluster.engine_main",
                args,
                f"engine{eid}.log",
            )
            self.procs[f"engine{eid}"] = self.spawn(*self.spawn_args[f"engine{eid}"])
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float) -> ClusterHealth:
        deadline = time.monotonic() + timeout_s
        while True:
            for name in self.procs:
                self.check_alive(name)
            health = query_health(self.address, self.keys)
            if health is not None and sum(e.alive for e in health.engines) == self.config.num_engines:
                return health
            if time.monotonic() > deadline:
                raise DualpathError(f"cluster not ready after {timeout_s} s; logs in {self.run_dir}")
            time.sleep(0.2)

    # ------------------------------------------------------------------ standbys
    def new_standby(self) -> Standby:
        """Start a warm spare (its template: engine 0's arguments; the model is the same for all)."""
        self.num_standbys += 1
        n, template = self.num_standbys, self.spawn_args["engine0"][1]
        warm = self.run_dir / f"standby{n}.warm"
        proc = self.spawn(
            "dualpath.runtime.cluster.engine_main", template, f"standby{n}.log", ("--standby",), (str(warm),)
        )
        sb = Standby(proc=proc, warm_file=warm)
        self.standbys.append(sb)
        return sb

    def take_standby(self, name: str, generation: int) -> subprocess.Popen[bytes] | None:
        """Hand engine ``name`` (as ``generation``) to a warm spare; None if none is warm."""
        for sb in self.standbys:
            if not sb.warm or sb.proc.stdin is None:
                continue
            self.standbys.remove(sb)
            args = self.engine_args(int(name.removeprefix("engine")), generation)
            log = str(self.run_dir / self.spawn_args[name][2])
            try:
                sb.proc.stdin.write(msgspec.json.encode([args, log]) + b"\n")
                sb.proc.stdin.close()
            except OSError:
                continue
            return sb.proc
        return None

    # ------------------------------------------------------------------ processes
    def proc(self, name: str) -> subprocess.Popen[bytes]:
        return self.procs[name]

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items()}

    def respawn(self, name: str, generation: int) -> tuple[subprocess.Popen[bytes], bool]:
        """Start ``name`` again (the scheduler on its address; an engine under its id, as
        ``generation``), through a warm standby when there is one; (process, via standby)."""
        proc = self.take_standby(name, generation) if name != "scheduler" else None
        via = proc is not None
        if proc is None:
            module, args, log = self.spawn_args[name]
            if isinstance(args, EngineArgs):
                args = self.engine_args(args.engine_id, generation)
            proc = self.spawn(module, args, log)
        self.procs[name] = proc
        return proc, via

    def check_alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            log = self.run_dir / f"{name}.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise DualpathError(f"{name} exited with code {proc.returncode}; log {log}:\n{tail}")

    def stop(self) -> None:
        procs = list(self.procs.values()) + [sb.proc for sb in self.standbys]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

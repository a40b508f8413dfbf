"""LocalCluster: start the scheduler service and every engine as local processes.

``with LocalCluster(cfg) as cluster:`` spawns ``python -m dualpath.runtime.cluster.scheduler`` and one
``python -m dualpath.runtime.cluster.engine_main`` per engine (logs under ``cluster.run_dir``), waits
until every engine has registered, and on exit stops them all and removes shared-memory clocks.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from pathlib import Path
from typing import ClassVar

import msgspec
import zmq

from dualpath.core.errors import DualpathError
from dualpath.runtime.cluster.api import ClusterHealth
from dualpath.runtime.cluster.config import ClusterConfig
from dualpath.runtime.cluster.engine_main import EngineArgs
from dualpath.runtime.cluster.messages import Query, QueryReply, decode, encode
from dualpath.runtime.cluster.scheduler import SchedulerArgs
from dualpath.runtime.cluster.traffic import links_dir
from dualpath.runtime.kvstore.limits import capacity_from_gb
from dualpath.runtime.transfer.auth import ClusterKeys


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM when the process that started it dies (no orphans)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def tiny_model_dir(root: Path) -> Path:
    """A small random Llama checkpoint (the ``--tiny`` model), made once under ``root``."""
    from dualpath.runtime.model.tiny import TinySpec, make_tiny_checkpoint

    folder = root / "tiny-model"
    if not (folder / "config.json").is_file():
        make_tiny_checkpoint(folder, TinySpec(vocab_size=512, hidden_size=128, intermediate_size=256,
                                              num_layers=4, num_heads=4, num_kv_heads=2))
    return folder


class LocalCluster:
    _running: ClassVar[weakref.WeakSet[LocalCluster]] = weakref.WeakSet()

    def __init__(self, config: ClusterConfig, *, startup_timeout_s: float = 180.0,
                 auth: bool = False) -> None:
        """``auth``: CURVE-authenticate the control and data planes with keys made now (written
        0600 to ``key_file`` in the run directory; clients need ``keys``)."""
        self.config = config
        self.startup_timeout_s = startup_timeout_s
        self.cluster_id = uuid.uuid4().hex[:12]
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"dualpath-{self.cluster_id}-"))
        os.chmod(self.run_dir, 0o700)
        self.keys: ClusterKeys | None = ClusterKeys.generate() if auth else None
        self.key_file = self.keys.write(self.run_dir / "cluster.key") if self.keys else None
        self.address = ""
        self.scheduler_proc: subprocess.Popen[bytes] | None = None
        self.engine_procs: dict[int, subprocess.Popen[bytes]] = {}

    def _spawn(self, module: str, args: msgspec.Struct, log: str) -> subprocess.Popen[bytes]:
        out = open(self.run_dir / log, "wb")
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        return subprocess.Popen([sys.executable, "-m", module, msgspec.json.encode(args).decode()],
                                stdout=out, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=_die_with_parent)

    def start(self) -> LocalCluster:
        cfg = self.config
        if cfg.model != "tiny":  # a bad model name fails here, at once, not in every engine
            from dualpath.runtime.model.loader import resolve_model

            resolve_model(cfg.model)
        Path(cfg.kv_dir).mkdir(parents=True, exist_ok=True)
        cap = capacity_from_gb(cfg.kv_capacity_gb, cfg.kv_dir)  # once, for every process
        writer_cap = cap // cfg.num_decode_engines  # DEs persist: each bounds its index at 1/D
        engine_cfg = (msgspec.structs.replace(cfg, model=str(tiny_model_dir(self.run_dir)))
                      if cfg.model == "tiny" else cfg)
        port_file = self.run_dir / "scheduler.addr"
        key_file = str(self.key_file or "")
        self.scheduler_proc = self._spawn("dualpath.runtime.cluster.scheduler", SchedulerArgs(
            cluster=cfg, port_file=str(port_file), kv_capacity_bytes=cap, key_file=key_file),
            "scheduler.log")
        deadline = time.monotonic() + 30
        while not port_file.exists():
            self._check_alive("scheduler", self.scheduler_proc)
            if time.monotonic() > deadline:
                raise DualpathError(f"scheduler did not start; see {self.run_dir / 'scheduler.log'}")
            time.sleep(0.05)
        self.address = port_file.read_text().strip()
        for eid in range(cfg.num_engines):
            self.engine_procs[eid] = self._spawn("dualpath.runtime.cluster.engine_main", EngineArgs(
                cluster=engine_cfg, scheduler=self.address, role=cfg.role_of(eid),
                node_id=cfg.node_of(eid), engine_id=eid, cluster_id=self.cluster_id,
                kv_capacity_bytes=writer_cap if cfg.role_of(eid) == "decode" else cap,
                key_file=key_file), f"engine{eid}.log")
        LocalCluster._running.add(self)
        self.wait_ready()
        return self

    @classmethod
    def running(cls) -> list[LocalCluster]:
        """Clusters of this process started and not yet stopped (for failure reports)."""
        return list(cls._running)

    def log_tails(self, chars: int = 3000) -> str:
        """The end of each process's log, with each process's state (exit code or running)."""
        procs = {"scheduler": self.scheduler_proc} | {f"engine{e}": p for e, p in self.engine_procs.items()}
        parts = []
        for name, proc in procs.items():
            state = "not started" if proc is None else (
                "running" if proc.poll() is None else f"exited with code {proc.returncode}")
            log = self.run_dir / f"{name}.log"
            text = log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"
            parts.append(f"--- {name} ({state}) {log}\n{text}")
        return "\n".join(parts)

    def _check_alive(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is not None:
            log = self.run_dir / ("scheduler.log" if name == "scheduler" else f"{name}.log")
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise DualpathError(f"{name} exited with code {proc.returncode}; log {log}:\n{tail}")

    def wait_ready(self) -> ClusterHealth:
        """Block until every engine is registered and alive (raises on timeout or a crash)."""
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            for eid, proc in self.engine_procs.items():
                self._check_alive(f"engine{eid}", proc)
            health = self.health()
            if health is not None and sum(e.alive for e in health.engines) == self.config.num_engines:
                return health
            if time.monotonic() > deadline:
                raise DualpathError(f"cluster not ready after {self.startup_timeout_s} s; logs in {self.run_dir}")
            time.sleep(0.2)

    def health(self, timeout_s: float = 2.0) -> ClusterHealth | None:
        """Synchronous health query (usable inside or outside an event loop); None if no answer."""
        ctx: zmq.Context = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.keys is not None:
            self.keys.client(sock)
        try:
            sock.connect(self.address)
            sock.send_multipart([b"", encode(Query(query_id=1, what="health"))])
            if not sock.poll(int(timeout_s * 1000)):
                return None
            reply = decode(sock.recv_multipart()[-1])
            return reply.health if isinstance(reply, QueryReply) else None
        finally:
            sock.close(0)

    def kill_engine(self, engine_id: int) -> None:
        """SIGKILL one engine process (failure tests)."""
        proc = self.engine_procs[engine_id]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop(self) -> None:
        LocalCluster._running.discard(self)
        procs = list(self.engine_procs.values()) + ([self.scheduler_proc] if self.scheduler_proc else [])
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        shutil.rmtree(links_dir(self.cluster_id), ignore_errors=True)
        if not os.environ.get("DUALPATH_KEEP_LOGS"):
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

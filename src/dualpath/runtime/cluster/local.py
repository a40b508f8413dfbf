"""LocalCluster: start the scheduler service and every engine as local processes.

``with LocalCluster(cfg) as cluster:`` spawns ``python -m dualpath.runtime.cluster.scheduler`` and one
``python -m dualpath.runtime.cluster.engine_main`` per engine (logs under ``cluster.run_dir``), waits
until every engine has registered, and on exit stops them all and removes shared-memory clocks.
With ``supervise`` (the default) a ``Supervisor`` thread (runtime/cluster/supervisor.py) restarts
any of them that dies, with backoff; ``restarts`` counts them per role. Spawning, the standby,
respawn, signals and logs are ``local_procs.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
import weakref
from pathlib import Path
from typing import ClassVar

import msgspec
import zmq

from dualpath.core.errors import ConfigError, DualpathError
from dualpath.runtime.cluster.api import ClusterHealth
from dualpath.runtime.cluster.config import ClusterConfig
from dualpath.runtime.cluster.engine_main import EngineArgs
from dualpath.runtime.cluster.local_procs import ClusterProcesses
from dualpath.runtime.cluster.memory import available_memory_bytes, check_fits, parse_memory
from dualpath.runtime.cluster.messages import Query, QueryReply, decode, encode
from dualpath.runtime.cluster.scheduler import SchedulerArgs
from dualpath.runtime.cluster.supervisor import Supervisor
from dualpath.runtime.cluster.traffic import links_dir
from dualpath.runtime.kvstore.limits import capacity_from_gb
from dualpath.runtime.transfer.auth import ClusterKeys


def tiny_model_dir(root: Path) -> Path:
    """A small random Llama checkpoint (the ``--tiny`` model), made once under ``root``."""
    from dualpath.runtime.model.tiny import TinySpec, make_tiny_checkpoint

    folder = root / "tiny-model"
    if not (folder / "config.json").is_file():
        make_tiny_checkpoint(
            folder,
            TinySpec(
                vocab_size=512,
                hidden_size=128,
                intermediate_size=256,
                num_layers=4,
                num_heads=4,
                num_kv_heads=2,
            ),
        )
    return folder


def check_kv_dir(kv_dir: str) -> None:
    """The KV directory exists (made if absent) and takes a file; ConfigError naming it if not."""
    path = Path(kv_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".dualpath-probe-", dir=path)
        try:
            os.write(fd, b"dualpath")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise ConfigError("kv_dir", kv_dir, f"not a writable directory: {exc.strerror or exc}") from None


def fixed_budget(cfg: ClusterConfig) -> ClusterConfig:
    """``cfg`` with a fractional ``--kv-cache-memory`` turned into bytes, measured now (every
    engine gets the same budget, whatever the others took first)."""
    check_fits(cfg.engine.kv_cache_memory, cfg.num_engines)
    size, fraction = parse_memory(cfg.engine.kv_cache_memory)
    if not fraction:
        return cfg
    budget = str(int(fraction * available_memory_bytes()))
    return msgspec.structs.replace(cfg, engine=msgspec.structs.replace(cfg.engine, kv_cache_memory=budget))


class LocalCluster(ClusterProcesses):
    _running: ClassVar[weakref.WeakSet[LocalCluster]] = weakref.WeakSet()

    def __init__(
        self,
        config: ClusterConfig,
        *,
        startup_timeout_s: float = 180.0,
        auth: bool = False,
        supervise: bool = True,
        standby: bool = False,
    ) -> None:
        """``auth``: CURVE-authenticate the control and data planes with keys made now (written
        0600 to ``key_file`` in the run directory; clients need ``keys``). ``supervise``: restart
        any process that dies (after start; a failure during start raises). ``standby``: keep one
        warm spare engine process (model loaded) that a restarted engine becomes at once (one
        process more, one model copy more in memory)."""
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
        self.supervise = supervise
        self.supervisor: Supervisor | None = None
        self._spawn_args: dict[str, tuple[str, msgspec.Struct, str]] = {}  # name -> how to start it
        self.standby = standby
        self._standby: subprocess.Popen[bytes] | None = None
        self._standbys = 0

    def start(self) -> LocalCluster:
        cfg = self.config
        if cfg.model != "tiny":  # a bad model name fails here, at once, not in every engine
            from dualpath.runtime.model.loader import resolve_model

            resolve_model(cfg.model)
        check_kv_dir(cfg.kv_dir)  # before any process starts: a clear error, at once
        cap = capacity_from_gb(cfg.kv_capacity_gb, cfg.kv_dir)  # once, for every process
        writer_cap = cap // cfg.num_decode_engines  # DEs persist: each bounds its index at 1/D
        engine_cfg = fixed_budget(cfg)  # a fraction of the free memory, measured once for all
        if cfg.model == "tiny":
            engine_cfg = msgspec.structs.replace(engine_cfg, model=str(tiny_model_dir(self.run_dir)))
        port_file = self.run_dir / "scheduler.addr"
        sargs = SchedulerArgs(
            cluster=cfg,
            port_file=str(port_file),
            kv_capacity_bytes=cap,
            key_file=str(self.key_file or ""),
            state_file=str(self.run_dir / "scheduler.state"),
        )
        self.scheduler_proc = self._spawn("dualpath.runtime.cluster.scheduler", sargs, "scheduler.log")
        deadline = time.monotonic() + 30
        while not port_file.exists():
            self._check_alive("scheduler", self.scheduler_proc)
            if time.monotonic() > deadline:
                raise DualpathError(f"scheduler did not start; see {self.run_dir / 'scheduler.log'}")
            time.sleep(0.05)
        self.address = port_file.read_text().strip()
        bound = msgspec.structs.replace(cfg, scheduler_port=int(self.address.rsplit(":", 1)[1]))
        self._spawn_args["scheduler"] = (
            "dualpath.runtime.cluster.scheduler",  # (a restart: same address)
            msgspec.structs.replace(sargs, cluster=bound),
            "scheduler.log",
        )
        for eid in range(cfg.num_engines):
            self.engine_procs[eid] = self._spawn(
                "dualpath.runtime.cluster.engine_main",
                EngineArgs(
                    cluster=engine_cfg,
                    scheduler=self.address,
                    role=cfg.role_of(eid),
                    node_id=cfg.node_of(eid),
                    engine_id=eid,
                    cluster_id=self.cluster_id,
                    kv_capacity_bytes=writer_cap if cfg.role_of(eid) == "decode" else cap,
                    key_file=str(self.key_file or ""),
                    weights_dir=str(self.run_dir),  # one mapped copy of the weights for the host
                ),
                f"engine{eid}.log",
                name=f"engine{eid}",
            )
        LocalCluster._running.add(self)
        self.wait_ready()
        if self.supervise:
            if self.standby:
                self._new_standby()
            self.supervisor = Supervisor(self)
            self.supervisor.start()
        return self

    @property
    def restarts(self) -> dict[str, int]:
        """Processes the supervisor restarted, per role ("scheduler", "prefill", "decode")."""
        return dict(self.supervisor.restarts) if self.supervisor is not None else {}

    @classmethod
    def running(cls) -> list[LocalCluster]:
        """Clusters of this process started and not yet stopped (for failure reports)."""
        return list(cls._running)

    def wait_ready(self, timeout_s: float | None = None) -> ClusterHealth:
        """Block until every engine is registered and alive (raises on timeout, or on a crash
        while no supervisor restarts crashed processes)."""
        deadline = time.monotonic() + (timeout_s or self.startup_timeout_s)
        while True:
            for eid, proc in self.engine_procs.items():
                if self.supervisor is None:
                    self._check_alive(f"engine{eid}", proc)
            health = self.health()
            if health is not None and sum(e.alive for e in health.engines) == self.config.num_engines:
                return health
            if time.monotonic() > deadline:
                raise DualpathError(
                    f"cluster not ready after {self.startup_timeout_s} s; logs in {self.run_dir}"
                )
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

    def stop(self) -> None:
        LocalCluster._running.discard(self)
        if self.supervisor is not None:
            self.supervisor.close()
        procs = list(self.engine_procs.values()) + ([self.scheduler_proc] if self.scheduler_proc else [])
        procs += [self._standby] if self._standby is not None else []
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

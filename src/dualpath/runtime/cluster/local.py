"""LocalCluster: a cluster of local processes, supervised from a process of its own.

``with LocalCluster(cfg) as cluster:`` checks what can be checked at once (the model's name, the KV
directory takes a file, the KV budget fits the memory available), starts the supervisor process
(``supervisor_main.py``), which starts ``python -m dualpath.runtime.cluster.scheduler`` and one
``python -m dualpath.runtime.cluster.engine_main`` per engine (logs under ``cluster.run_dir``) and,
with ``supervise`` (the default), restarts any that dies; returns once every engine is ready; on
exit stops them all and removes shared-memory clocks. The supervisor's ``status.json`` gives this
process the scheduler's address, the pids (``pids``, ``signal``, ``kill_engine``), restart counts
and events. Everything dies with the process that started the cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from dualpath.core.errors import ConfigError, DualpathError
from dualpath.runtime.cluster.api import ClusterHealth
from dualpath.runtime.cluster.config import ClusterConfig
from dualpath.runtime.cluster.kv_backend import capacity_bytes, start_store_service, uses_directory
from dualpath.runtime.cluster.local_procs import query_health
from dualpath.runtime.cluster.memory import available_memory_bytes, check_fits, parse_memory
from dualpath.runtime.cluster.supervisor_main import SupervisorArgs
from dualpath.runtime.cluster.traffic import links_dir
from dualpath.runtime.kvstore.mooncake_service import MooncakeService
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


SUPERVISOR_CHECK_S = 0.5  # how often the starting process checks that the supervisor lives


class LocalCluster:
    _running: ClassVar[weakref.WeakSet[LocalCluster]] = weakref.WeakSet()

    def __init__(
        self,
        config: ClusterConfig,
        *,
        startup_timeout_s: float = 180.0,
        auth: bool = False,
        supervise: bool = True,
        standby: bool | int | None = None,
    ) -> None:
        """``auth``: CURVE-authenticate the control and data planes with keys made now (written
        0600 to ``key_file`` in the run directory; clients need ``keys``). ``supervise``: restart
        any process that dies (after start; a failure during start raises). ``standby``: warm spare
        engine processes (model loaded) a restarted engine becomes at once (True: 1; None: the
        config's ``supervisor.standby``)."""
        if standby is not None:
            sup = msgspec.structs.replace(config.supervisor, standby=int(standby))
            config = msgspec.structs.replace(config, supervisor=sup)
        self.config = config
        self.startup_timeout_s = startup_timeout_s
        self.cluster_id = uuid.uuid4().hex[:12]
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"dualpath-{self.cluster_id}-"))
        os.chmod(self.run_dir, 0o700)
        self.keys: ClusterKeys | None = ClusterKeys.generate() if auth else None
        self.key_file = self.keys.write(self.run_dir / "cluster.key") if self.keys else None
        self.address = ""
        self.supervise = supervise
        self.supervisor_proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._kv_service: MooncakeService | None = None

    def start(self) -> LocalCluster:
        cfg = self.config
        if cfg.model != "tiny":  # a bad model name fails here, at once, not in every engine
            from dualpath.runtime.model.loader import resolve_model

            resolve_model(cfg.model)
        if uses_directory(cfg):
            check_kv_dir(cfg.kv_dir)  # before any process starts: a clear error, at once
        cfg, self._kv_service = start_store_service(cfg, self.run_dir)  # mooncake without a master
        self.config = cfg
        cap = capacity_bytes(cfg)  # once, for every process
        engine_cfg = fixed_budget(cfg)  # a fraction of the free memory, measured once for all
        if cfg.model == "tiny":
            engine_cfg = msgspec.structs.replace(engine_cfg, model=str(tiny_model_dir(self.run_dir)))
        self._args = SupervisorArgs(cluster=cfg, engine_cluster=engine_cfg, run_dir=str(self.run_dir),
                                    cluster_id=self.cluster_id, key_file=str(self.key_file or ""),
                                    kv_capacity_bytes=cap, supervise=self.supervise,
                                    startup_timeout_s=self.startup_timeout_s)  # fmt: skip
        self._spawn_supervisor()
        LocalCluster._running.add(self)
        self.address = self._wait_status()["address"]
        if self.supervise:
            threading.Thread(target=self._watch, daemon=True, name="dualpath-supervisor-watch").start()
        return self

    def _spawn_supervisor(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        with open(self.run_dir / "supervisor.log", "ab") as out:
            self.supervisor_proc = subprocess.Popen(
                [sys.executable, "-m", "dualpath.runtime.cluster.supervisor_main",
                 msgspec.json.encode(self._args).decode()],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            )  # fmt: skip

    def _watch(self) -> None:
        """The supervisor process died (its children die with it): start it again, on the same
        scheduler address, carrying its restart counts (the scheduler restores its own)."""
        while not self._stopping.wait(SUPERVISOR_CHECK_S):
            p = self.supervisor_proc
            if p is None or p.poll() is None:
                continue
            st = self.status()
            restarts = {k: int(v) for k, v in st.get("restarts", {}).items()}
            restarts["supervisor"] = restarts.get("supervisor", 0) + 1
            port = int(self.address.rsplit(":", 1)[1])
            cfg = msgspec.structs.replace(self._args.cluster, scheduler_port=port)
            self._args = msgspec.structs.replace(
                self._args, cluster=cfg, restarts=restarts,
                engine_restarts={int(k): int(v) for k, v in st.get("engine_restarts", {}).items()},
            )  # fmt: skip
            (self.run_dir / "status.json").unlink(missing_ok=True)  # (its pids are gone)
            print(f"local cluster: the supervisor (pid {p.pid}) exited with code {p.returncode}; "
                  "starting it (and the cluster) again", file=sys.stderr, flush=True)  # fmt: skip
            try:
                self._spawn_supervisor()
                self._wait_status()
            except (OSError, DualpathError) as exc:
                print(f"local cluster: restarting the supervisor failed: {exc}", file=sys.stderr, flush=True)

    def _wait_status(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.startup_timeout_s + 30
        while True:
            st = self.status()
            mine = self.supervisor_proc is not None and st.get("supervisor_pid") == self.supervisor_proc.pid
            if mine and st.get("state") == "ready":
                return st
            if mine and st.get("state") == "error":
                raise DualpathError(str(st.get("error")))
            assert self.supervisor_proc is not None
            if self.supervisor_proc.poll() is not None:
                tail = (self.run_dir / "supervisor.log").read_text(errors="replace")[-2000:]
                raise DualpathError(
                    f"the cluster supervisor exited with code {self.supervisor_proc.returncode}:\n{tail}"
                )
            if time.monotonic() > deadline:
                raise DualpathError(
                    f"cluster not ready after {self.startup_timeout_s} s; logs in {self.run_dir}"
                )
            time.sleep(0.1)

    def status(self) -> dict[str, Any]:
        """The supervisor's last ``status.json`` ({} before it wrote one)."""
        try:
            return dict(json.loads((self.run_dir / "status.json").read_text()))
        except (OSError, ValueError):
            return {}

    def pids(self) -> dict[str, int]:
        """The current pid of each process ("scheduler", "engine<id>"; "supervisor" too)."""
        out = {k: int(v) for k, v in self.status().get("pids", {}).items()}
        if self.supervisor_proc is not None:
            out["supervisor"] = self.supervisor_proc.pid
        return out

    @property
    def engine_procs(self) -> dict[int, _Pid]:
        """Engine id -> its current process (``.pid``), as the supervisor last wrote them."""
        return {
            int(n.removeprefix("engine")): _Pid(p) for n, p in self.pids().items() if n.startswith("engine")
        }

    @property
    def restarts(self) -> dict[str, int]:
        """Processes the supervisor restarted, per role ("scheduler", "prefill", "decode")."""
        return {k: int(v) for k, v in self.status().get("restarts", {}).items()}

    @property
    def events(self) -> list[str]:
        """The supervisor's latest events (deaths, restarts, kills), oldest first."""
        return list(self.status().get("events", []))

    @classmethod
    def running(cls) -> list[LocalCluster]:
        """Clusters of this process started and not yet stopped (for failure reports)."""
        return list(cls._running)

    def health(self, timeout_s: float = 2.0) -> ClusterHealth | None:
        """Synchronous health query (usable inside or outside an event loop); None if no answer."""
        return query_health(self.address, self.keys, timeout_s)

    def signal(self, name: str, sig: int) -> int:
        """Send ``sig`` to the process of ``name`` (fault tests, the chaos benchmark); its pid."""
        pid = self.pids()[name]
        os.kill(pid, sig)
        return pid

    def kill_engine(self, engine_id: int) -> None:
        """SIGKILL one engine process and wait until it is gone (failure tests)."""
        pid = self.signal(f"engine{engine_id}", signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _exists(pid):
            time.sleep(0.02)

    def log_tails(self, chars: int = 3000) -> str:
        """The end of each process's log in the run directory."""
        parts = []
        for log in sorted(self.run_dir.glob("*.log")):
            text = log.read_text(errors="replace")[-chars:]
            parts.append(f"--- {log.stem} {log}\n{text}")
        return "\n".join(parts)

    def stop(self) -> None:
        LocalCluster._running.discard(self)
        self._stopping.set()
        p = self.supervisor_proc
        if p is not None and p.poll() is None:
            p.terminate()  # (it stops its children first)
            try:
                p.wait(40)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if self._kv_service is not None:
            self._kv_service.stop()  # after the engines: every block goes with it
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


@dataclass(frozen=True, slots=True)
class _Pid:
    """A process of the cluster, known by its pid (the supervisor process owns it)."""

    pid: int


def _exists(pid: int) -> bool:
    """``pid`` is a live process (not gone, not a zombie its parent has yet to reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"

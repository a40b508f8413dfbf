"""A Mooncake Store for one cluster: ``mooncake_master`` plus one holder of the memory.

``dualpath serve --kv-backend mooncake`` without ``--mooncake-master`` starts both from the
``mooncake-transfer-engine-non-cuda`` package: the master (RPC on ``host``, its HTTP metadata
server on a second port, no etcd) and ``mooncake_client``, a process that mounts a global segment
of ``segment_bytes`` (the store's capacity; ``--kv-capacity-gb``, default ``DEFAULT_SEGMENT_BYTES``)
and serves it over ``tcp``. Engines connect as clients that mount nothing. The master evicts at
its high watermark (90% of the segments, Mooncake's default). Stopping the service (``stop``)
ends both processes; their memory, and so every block, goes with them.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from dualpath.core.errors import ConfigError
from dualpath.runtime.kvstore.mooncake_backend import INSTALL, MooncakeSpec

DEFAULT_SEGMENT_BYTES = 1 << 30  # the holder's memory when --kv-capacity-gb is not given (1 GiB)
# An object's lease after a read starts: Mooncake's default, 10 s. A read that outlives its lease
# fails (LEASE_EXPIRED: a miss here); 2 s was too short for 16.8 MB blocks read four at a time on a
# loaded 2-core machine (benchmarks/storage_read.py). A leased object is not evicted by the master.
LEASE_MS = 10_000
START_TIMEOUT_S = 30.0  # for the master's port and the holder's segment (~1 s on a quiet CPU)


def binary(name: str) -> Path:
    """Path of a program shipped in the ``mooncake`` package; ConfigError if it is not installed."""
    try:
        import mooncake
    except ImportError as exc:
        raise ConfigError("kv_backend", "mooncake", f"cannot import mooncake ({exc}); {INSTALL}") from None
    path = Path(mooncake.__file__).parent / name
    if not path.is_file():
        raise ConfigError("kv_backend", "mooncake", f"{path} is missing from the mooncake package; {INSTALL}")
    return path


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _wait_port(host: str, port: int, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise ConfigError("kv_backend", "mooncake", f"{what} exited ({proc.returncode}): {tail}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return
        time.sleep(0.05)
    raise ConfigError(
        "kv_backend", "mooncake", f"{what} did not listen on {host}:{port} in {START_TIMEOUT_S} s"
    )


@dataclass
class MooncakeService:
    """The master and holder processes (``start``), their spec for clients, ``stop``."""

    spec: MooncakeSpec
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def start(
        cls, workdir: str | Path, host: str = "127.0.0.1", segment_bytes: int = DEFAULT_SEGMENT_BYTES
    ) -> MooncakeService:
        """Start both processes (logs in ``workdir``); returns once the holder's port is up."""
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        rpc, meta, metrics, holder = (_free_port(host) for _ in range(4))
        spec = MooncakeSpec(master=f"{host}:{rpc}", metadata=f"http://{host}:{meta}/metadata", host=host)
        svc = cls(spec)
        try:
            svc._run("mooncake_master", workdir, host, rpc, [
                f"--rpc_address={host}", f"--rpc_port={rpc}", "--enable_http_metadata_server=true",
                f"--http_metadata_server_host={host}", f"--http_metadata_server_port={meta}",
                f"--metrics_port={metrics}", "--enable_metric_reporting=false", f"--default_kv_lease_ttl={LEASE_MS}",
            ])  # fmt: skip
            svc._run("mooncake_client", workdir, host, holder, [
                f"--host={host}", f"--port={holder}", f"--global_segment_size={segment_bytes}",
                f"--master_server_address={spec.master}", f"--metadata_server={spec.metadata}", "--protocol=tcp",
            ])  # fmt: skip
        except BaseException:
            svc.stop()
            raise
        return svc

    def _run(self, name: str, workdir: Path, host: str, port: int, args: list[str]) -> None:
        log = workdir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([str(binary(name)), *args], stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        _wait_port(host, port, proc, name, log)

    def stop(self) -> None:
        """End the holder, then the master (SIGTERM, then SIGKILL after 5 s)."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()

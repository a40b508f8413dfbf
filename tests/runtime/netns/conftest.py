"""Engines on separate hosts, for real: Linux network namespaces made by ``deploy/netns/netns.sh``
(one per process, veth pairs on a bridge in the root namespace, compute-NIC caps by tc tbf), the
scheduler and each engine started in its own namespace with the documented commands
(``dualpath scheduler``, ``dualpath engine --restart-on-exit``), the test process the client in
the root namespace. Needs root and ``ip netns``; skipped with the reason otherwise. The
namespaces, veths and bridge are removed in the fixture's finalizer, whatever the tests did."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "deploy" / "netns" / "netns.sh"
HOSTS = 4  # 0: scheduler, 1: prefill engine, 2: decode engine, 3: intruders
PORT = 7500
CNIC_MBIT = 400  # each host's link, tc tbf in each direction (50 MB/s: the tiny model's KV is ~2 KB/token)


def _why_not() -> str:
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    for tool in ("ip", "tc", "bash"):
        if shutil.which(tool) is None:
            return f"{tool} (iproute2) is not installed"
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"`ip netns` is unavailable: {done.stderr.strip()}"
    return ""


class Hosts:
    """The namespaces and what the tests started in them (every process killed at teardown)."""

    def __init__(self, name: str, subnet: str, run_dir: Path, cnic: str) -> None:
        self.name, self.subnet, self.run_dir, self.cnic = name, subnet, run_dir, cnic
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.model = ""
        self.use("zmq")

    def use(self, transport: str) -> None:
        """The next cluster: engines on ``transport``, its own key, KV directory, state and logs."""
        self.transport, self.dir = transport, self.run_dir / transport
        self.kv_dir, self.key_file = self.dir / "kv", self.dir / "cluster.key"
        self.kv_dir.mkdir(parents=True, exist_ok=True)

    def ip(self, host: int) -> str:
        return f"{self.subnet}.{host + 2}"

    @property
    def address(self) -> str:
        return f"tcp://{self.ip(0)}:{PORT}"

    def veth(self, host: int) -> str:
        """The root-namespace end of ``host``'s veth (its rx counts what the host sent)."""
        return f"{self.name}v{host}"

    def sent_bytes(self, host: int) -> int:
        """Bytes ``host`` sent on its link, as the kernel counted them."""
        return int(Path(f"/sys/class/net/{self.veth(host)}/statistics/rx_bytes").read_text())

    def start(self, label: str, host: int, *argv: str) -> subprocess.Popen[bytes]:
        """``dualpath ARGV`` inside ``host``'s namespace, output to ``<label>.log``."""
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        if self.transport == "nixl":  # (the namespaces share one kernel and /dev/shm: UCX's shared
            env.setdefault("UCX_TLS", "tcp")  # memory and cma would bypass the veths; hosts have tcp)
        cmd = ["ip", "netns", "exec", f"{self.name}-{host}", sys.executable, "-m", "dualpath.cli", *argv]
        with open(self.dir / f"{label}.log", "ab") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        self.procs[label] = proc
        return proc

    def log(self, label: str) -> str:
        path = self.dir / f"{label}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start_scheduler(self, *extra: str) -> subprocess.Popen[bytes]:
        return self.start("scheduler", 0, "scheduler", "--kv-dir", str(self.kv_dir), "--host", self.ip(0),
                          "--port", str(PORT), "--model", self.model, "--key-file", str(self.key_file),
                          "--state-file", str(self.dir / "scheduler.state"), *extra)  # fmt: skip

    def start_engine(self, label: str, host: int, role: str, *extra: str) -> subprocess.Popen[bytes]:
        flags = ("--cnic-gbps", str(CNIC_MBIT / 1000)) if self.cnic == "emulate" else ()
        return self.start(label, host, "engine", "--role", role, "--scheduler", f"{self.ip(0)}:{PORT}",
                          "--kv-dir", str(self.kv_dir), "--node-id", str(host - 1), "--host", self.ip(host),
                          "--model", self.model, "--kv-cache-memory", "64MiB", "--transport", self.transport,
                          "--cluster-id", f"{self.name}-{host}", *flags, *extra)  # fmt: skip

    def stop_all(self) -> None:
        """Kill every process started (keepers first: their engines die with them)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for host in range(HOSTS):  # (an engine whose keeper was killed gets SIGTERM: make sure)
            pids = subprocess.run(
                ["ip", "netns", "pids", f"{self.name}-{host}"], capture_output=True, text=True
            )
            for pid in pids.stdout.split():
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
        self.procs.clear()


def run(coro_fn: Callable[..., Any], *args: Any, timeout_s: float = 120.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro_fn(*args), timeout_s))


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 120.0, every_s: float = 0.5) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(every_s)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    """Four namespaces on a bridge, tc-capped links, the tiny model and a fresh KV directory."""
    why = _why_not()
    if why:
        pytest.skip(why)
    from dualpath.runtime.cluster.local import tiny_model_dir

    tag = os.getpid() % 100_000
    name, subnet = f"dpn{tag}", f"10.231.{tag % 250}"
    run_dir = tmp_path_factory.mktemp("netns")
    subprocess.run(["bash", str(SCRIPT), "down", name, str(HOSTS)], capture_output=True)  # (a stale one)
    try:
        done = subprocess.run(
            ["bash", str(SCRIPT), "up", name, str(HOSTS), "--subnet", subnet, "--cnic-mbit", str(CNIC_MBIT)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot make network namespaces here: {done.stderr.strip()}")
        cnic = done.stdout.strip().rsplit("=", 1)[-1]
        h = Hosts(name, subnet, run_dir, cnic)
        h.model = str(tiny_model_dir(run_dir))
        yield h
    finally:
        if "h" in locals():
            h.stop_all()
        subprocess.run(["bash", str(SCRIPT), "down", name, str(HOSTS)], capture_output=True, timeout=60)
        left = subprocess.run(["ip", "link", "show", f"{name}-br"], capture_output=True)
        assert left.returncode != 0, f"bridge {name}-br left behind"

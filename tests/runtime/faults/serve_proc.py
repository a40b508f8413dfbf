"""A real ``dualpath serve`` process (tiny model) for tests: started on a free port, waited for
until ``/health`` says "ok", stopped with Ctrl-C (SIGINT) and waited for."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

START_S = 240.0  # a cold start of the tiny 1P2D cluster takes 20-60 s on a loaded 2-core machine


@dataclass
class Served:
    url: str
    port: int
    proc: subprocess.Popen[str]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def served(kv_dir: Path, log: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Served]:
    """``dualpath serve --model tiny --kv-dir kv_dir --port FREE *args``, up and "ok"."""
    port = free_port()
    cmd = [sys.executable, "-m", "dualpath.cli", "serve", "--model", "tiny", "--kv-dir", str(kv_dir)]
    cmd += ["--port", str(port), *args]
    full_env = {**os.environ, **(env or {})}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=full_env)
    srv = Served(f"http://127.0.0.1:{port}", port, proc, log)
    try:
        _wait_ok(srv)
        yield srv
    finally:
        stop(proc)


def _wait_ok(srv: Served) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if srv.proc.poll() is not None:
            raise AssertionError(f"serve exited {srv.proc.returncode}:\n{srv.log_text()[-4000:]}")
        try:
            r = httpx.get(srv.url + "/health", timeout=5)
            if r.status_code == 200 and r.json().get("status") == "ok":
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"serve not ok after {START_S} s:\n{srv.log_text()[-4000:]}")


def stop(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    """Ctrl-C, then SIGKILL of the process group's leader if it does not exit in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)

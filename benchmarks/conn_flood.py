"""Connection flood against a real ``dualpath serve`` (tiny model, 1P2D, its defaults): N idle TCP
connections (default 20,000, issue 30's trial) opened by client processes and held, while the
benchmark measures ``/health`` and chat latency, the server log's growth, the connections the
server closed, and (``--kill-decode``) whether the supervisor restarts a decode engine killed
with SIGKILL mid-flood.

Before the connection limits, 20,000 idle connections exhausted the serve process's 20,000 file
descriptors: ``/health`` and chat timed out, a supervisor restart failed with "Too many open
files", and asyncio's accept error grew the log by 372 MB in a minute.

    .venv/bin/python benchmarks/conn_flood.py [--connections 20000] [--hold-s 30] [--kill-decode] [--json]

Run the server of another checkout with ``PYTHONPATH=/that/checkout/src`` (the same command).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

CLIENT = """
import socket, sys, time
n, port, hold_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
socks, failed = [], 0
for _ in range(n):
    try:
        socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    except OSError:
        failed += 1
print(len(socks), failed, flush=True)
time.sleep(hold_s)
"""
PER_CLIENT = 9000  # connections per client process (each has its own open-file limit)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(kv: Path, log: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "dualpath.cli", "serve", "--model", "tiny", "--kv-dir", str(kv)]
    with log.open("wb") as out:
        proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"serve exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json().get("status") == "ok":
                return proc
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise SystemExit("serve did not become ok in 300 s")


def _probe(url: str) -> tuple[float | None, float | None]:
    """Seconds for /health and for a 4-token chat (None: failed or timed out)."""
    t0 = time.monotonic()
    try:
        ok = httpx.get(url + "/health", timeout=10).status_code == 200
        health = time.monotonic() - t0 if ok else None
    except httpx.HTTPError:
        health = None
    body = {
        "model": "tiny",
        "max_tokens": 4,
        "temperature": 0,
        "messages": [{"role": "user", "content": "hi"}],
    }
    t0 = time.monotonic()
    try:
        ok = httpx.post(url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
        chat = time.monotonic() - t0 if ok else None
    except httpx.HTTPError:
        chat = None
    return health, chat


def _metric(url: str, name: str) -> dict[str, float]:
    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    return {
        ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name)
    }


def _decode_pid(serve_pid: int) -> int | None:
    """A decode engine child of the serve process (by its command line)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == serve_pid and b'"role":"decode"' in cmd:
            return int(entry)
    return None


def _restarts(url: str) -> float:
    return sum(v for k, v in _metric(url, "dualpath_process_restarts_total").items() if 'role="decode"' in k)


def _flood(args: argparse.Namespace, url: str, port: int, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    clients, left = [], args.connections
    while left > 0:
        n = min(PER_CLIENT, left)
        cmd = [sys.executable, "-c", CLIENT, str(n), str(port), str(args.hold_s)]
        clients.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
        left -= n
    probes, killed_at, restarted_s = [], None, None
    start, before = time.monotonic(), _restarts(url)
    while time.monotonic() - start < args.hold_s:
        probes.append(_probe(url))
        if args.kill_decode and killed_at is None and time.monotonic() - start > args.hold_s / 4:
            pid = _decode_pid(proc.pid)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed_at = time.monotonic()
        if killed_at is not None and restarted_s is None and _restarts(url) > before:
            restarted_s = time.monotonic() - killed_at
        time.sleep(0.5)
    opened = [c.stdout.readline().split() for c in clients if c.stdout is not None]
    for c in clients:
        c.wait(args.hold_s + 60)
    return {
        "opened": sum(int(o[0]) for o in opened if o),
        "connect_failed": sum(int(o[1]) for o in opened if o),
        "probes": probes,
        "killed_decode": killed_at is not None,
        "decode_restarted_after_s": None if restarted_s is None else round(restarted_s, 1),
    }


def _summary(xs: list[float | None]) -> dict[str, Any]:
    ok = [x for x in xs if x is not None]
    return {
        "ok": len(ok),
        "failed": len(xs) - len(ok),
        "median_s": round(statistics.median(ok), 3) if ok else None,
        "max_s": round(max(ok), 3) if ok else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="dualpath-flood-"))
    port, log = _free_port(), work / "serve.log"
    proc = _start(work / "kv", log, port)
    url = f"http://127.0.0.1:{port}"
    try:
        baseline = [_probe(url) for _ in range(5)]
        log_before = log.stat().st_size
        flood = _flood(args, url, port, proc)
        after = [_probe(url) for _ in range(5)]
        closed = _metric(url, "dualpath_http_connections_closed_total")
        accept = _metric(url, "dualpath_http_accept_errors_total")
        log_grown = log.stat().st_size - log_before
        text = log.read_text(errors="replace")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    fd_line = next((ln for ln in text.splitlines() if "open-file limit" in ln), "")
    return {
        "connections": args.connections,
        "hold_s": args.hold_s,
        "opened": flood["opened"],
        "connect_failed": flood["connect_failed"],
        "health_before": _summary([h for h, _ in baseline]),
        "chat_before": _summary([c for _, c in baseline]),
        "health_during": _summary([h for h, _ in flood["probes"]]),
        "chat_during": _summary([c for _, c in flood["probes"]]),
        "health_after": _summary([h for h, _ in after]),
        "closed_by_server": closed,
        "accept_errors": accept,
        "accept_error_log_lines": text.count("socket.accept() out of system resource")
        + text.count("HTTP accept failed"),
        "too_many_open_files_lines": text.count("Too many open files"),
        "log_grown_bytes": log_grown,
        "killed_decode": flood["killed_decode"],
        "decode_restarted_after_s": flood["decode_restarted_after_s"],
        "fd_limit_line": fd_line.strip(),
        "log": str(log),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connections", type=int, default=20_000)
    ap.add_argument("--hold-s", type=float, default=30.0, help="how long the flood is held")
    ap.add_argument("--kill-decode", action="store_true", help="SIGKILL a decode engine mid-flood")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = run(args)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"{res['opened']} idle connections held {args.hold_s:g} s ({res['connect_failed']} failed)"
    )
    for col in ("probe", "ok", "failed", "median (s)", "max (s)"):
        t.add_column(col)
    for key in ("health_before", "chat_before", "health_during", "chat_during", "health_after"):
        s = res[key]
        t.add_row(key.replace("_", " "), str(s["ok"]), str(s["failed"]), str(s["median_s"]), str(s["max_s"]))
    c = Console()
    c.print(t)
    c.print(f"server: {res['fd_limit_line']}")
    c.print(
        f"closed by the server {res['closed_by_server']}; accept errors {res['accept_errors']} "
        f"({res['accept_error_log_lines']} log lines); 'Too many open files' lines "
        f"{res['too_many_open_files_lines']}; log grew {res['log_grown_bytes']} bytes"
    )
    if res["killed_decode"]:
        c.print(f"decode engine killed mid-flood: restarted after {res['decode_restarted_after_s']} s")


if __name__ == "__main__":
    main()

"""Resident memory of a `dualpath serve` cluster, per process, against what each engine says it holds.

Starts ``python -m dualpath serve`` (the command a user runs: HTTP server + supervisor, scheduler,
engines, standby) on a free port, waits until ``/health`` says "ok", sends ``--requests`` short chat
requests (so each engine has run a forward pass and its allocator arenas exist), then reads, for the
serve process and every process under it, ``VmRSS`` / ``RssAnon`` / ``RssFile`` (``/proc/PID/status``)
and ``Pss`` (``/proc/PID/smaps_rollup``: shared pages divided among the processes mapping them, so the
PSS column sums to the cluster's share of the machine). Each engine's ``/health`` entry says what it
allocated (``memory``: weights, KV pool = paged cache / buffers / staging); the ratio column is RSS
over that sum (goal: <= 1.5). Exits 1 when a process's ratio misses the goal or the cluster total
(PSS) exceeds ``--budget-gb``.

    flock /tmp/dualpath-mem.lock .venv/bin/python benchmarks/serve_memory.py [--model smollm2-135m]
        [--requests 4] [--budget-gb 6] [--serve-args "--standby 1"] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

MiB = 1 << 20
RATIO_GOAL = 1.5  # RSS / (weights + KV pool) per engine process (issue 31)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile, RssShmem (bytes) and Pss (bytes) of ``pid``."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
            out[key] = int(rest.split()[0]) * 1024
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                out["Pss"] = int(line.split()[1]) * 1024
    except OSError:
        out["Pss"] = out.get("VmRSS", 0)
    return out


def _tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _name(pid: int, root: int, engines: dict[int, dict[str, Any]]) -> str:
    if pid == root:
        return "serve (HTTP server)"
    if pid in engines:
        e = engines[pid]
        return f"{e['role']} engine {e['engine_id']}"
    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    text = b" ".join(cmd).decode(errors="replace")
    if "cluster.scheduler" in text:
        return "scheduler"
    if "supervisor_main" in text:
        return "supervisor"
    if "--standby" in text:
        return "standby"
    if "engine_main" in text:
        return "engine (not registered)"
    return text[:40]


def _chat(url: str, model: str, n: int) -> None:
    with httpx.Client(timeout=300) as client:
        for i in range(n):
            r = client.post(
                url + "/v1/chat/completions",
                json={
                    "model": model,
                    "messages": [{"role": "user", "content": f"Say a number: {i}"}],
                    "max_tokens": 8,
                    "temperature": 0,
                },
            )
            if r.status_code != 200:
                raise SystemExit(f"chat request {i}: HTTP {r.status_code} {r.text[:500]}")


def _wait_ok(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"dualpath serve exited with code {proc.returncode}")
        try:
            h = httpx.get(url + "/health", timeout=5).json()
            if h.get("status") == "ok":
                return h
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(1.0)
    raise SystemExit(f"/health not ok after {timeout_s} s")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="dualpath-mem-") as kv:
        cmd = [sys.executable, "-m", "dualpath.cli", "serve", "--model", args.model, "--kv-dir", kv,
               "--port", str(port), *shlex.split(args.serve_args)]  # fmt: skip
        log = open(Path(kv) / "serve.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            health = _wait_ok(url, proc, args.startup_timeout_s)
            deadline = time.monotonic() + args.startup_timeout_s
            while not all(sb.get("warm") for sb in health.get("standby", [])):  # (measured loaded)
                if time.monotonic() > deadline:
                    raise SystemExit("the standby did not get warm")
                time.sleep(1.0)
                health = httpx.get(url + "/health", timeout=10).json()
            _chat(url, args.model, args.requests)
            time.sleep(args.settle_s)
            health = httpx.get(url + "/health", timeout=10).json()
            engines = {e["pid"]: e for e in health.get("engines", []) if e.get("pid")}
            rows = []
            for pid in _tree(proc.pid):
                try:
                    st = _status(pid)
                    name = _name(pid, proc.pid, engines)
                except OSError:
                    continue
                mem = engines.get(pid, {}).get("memory") or {}
                held = int(mem.get("weights_bytes", 0)) + int(mem.get("kv_pool_bytes", 0))
                rows.append({"process": name, "pid": pid, **st, "weights_kv_bytes": held})
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            log.close()
    rows.sort(key=lambda r: r["process"])
    return {"model": args.model, "serve_args": args.serve_args, "processes": rows,
            "total_rss_bytes": sum(r["VmRSS"] for r in rows),
            "total_pss_bytes": sum(r["Pss"] for r in rows),
            "load": os.getloadavg()}  # fmt: skip


def _print(result: dict[str, Any], budget_gb: float) -> list[str]:
    misses = []
    print(f"dualpath serve --model {result['model']} {result['serve_args']}  (load {result['load'][0]:.1f})")
    head = f"{'process':<28} {'pid':>7} {'RSS MiB':>8} {'anon':>7} {'file':>7} {'PSS MiB':>8} {'w+KV MiB':>9} {'RSS/w+KV':>8}"
    print(head)
    for r in result["processes"]:
        held = r["weights_kv_bytes"]
        ratio = r["VmRSS"] / held if held else None
        if ratio is not None and ratio > RATIO_GOAL:
            misses.append(f"{r['process']}: RSS {ratio:.2f}x its weights + KV pool (goal <= {RATIO_GOAL})")
        print(
            f"{r['process']:<28} {r['pid']:>7} {r['VmRSS'] / MiB:>8.0f} {r.get('RssAnon', 0) / MiB:>7.0f} "
            f"{r.get('RssFile', 0) / MiB:>7.0f} {r['Pss'] / MiB:>8.0f} "
            f"{(held / MiB if held else float('nan')):>9.0f} {(f'{ratio:.2f}' if ratio else '-'):>8}"
        )
    total = result["total_pss_bytes"] / 2**30
    print(f"total: RSS {result['total_rss_bytes'] / 2**30:.2f} GiB (shared pages counted per process), "
          f"PSS {total:.2f} GiB (the cluster's share of the machine; budget {budget_gb} GiB)")  # fmt: skip
    if total > budget_gb:
        misses.append(f"cluster PSS {total:.2f} GiB over the {budget_gb} GiB budget")
    return misses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--requests", type=int, default=4, help="chat requests before measuring")
    p.add_argument("--budget-gb", type=float, default=6.0, help="cluster PSS budget (GiB)")
    p.add_argument("--serve-args", default="", help="extra `dualpath serve` arguments")
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    p.add_argument("--settle-s", type=float, default=2.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = measure(args)
    if args.json:
        print(json.dumps(result, indent=2))
        misses: list[str] = []
    else:
        misses = _print(result, args.budget_gb)
        for m in misses:
            print(f"MISS: {m}")
    sys.exit(1 if misses else 0)


if __name__ == "__main__":
    main()

"""DualPath vs Basic vs Oracle throughput on a real local 1P2D cluster with storage NICs binding.

Method: one ``dualpath serve``-style cluster (runtime.cluster.demo.ServedCluster: the engines and
the HTTP API on a loopback port), reconfigured between systems; each system is one ``dualpath
bench`` run (bench.systems.measure_system) of the same agents with fresh tokens, so nobody hits
another system's blocks. Two throughputs per run: ``jct`` = generated tokens / JCT (includes the
tail of the longest agent) and ``steady`` = tokens generated between ``--warmup-s`` and the first
agent's end (at most ``--window-s`` long: every agent still running, no start-up or tail).
``--mode`` picks which one the ratios use.
1. Oracle (reads and PD transfers free) gives the compute-bound throughput and the storage read
   rate ``r`` (bytes/s of hit KV over its JCT) it would need.
2. The per-node storage-NIC cap is set to ``B = r / k`` with k = 3 (``--balance``): three nodes'
   SNICs together can just feed the Oracle's rate, one SNIC cannot (Basic reads only on the
   prefill node, so it gets about 1/k of it). This is the paper's setting: storage bandwidth binds
   for Basic, and pooling every node's SNIC removes the bottleneck.
3. Basic and DualPath run under that cap.
Prints DualPath/Basic (ideal 3x at 1P2D, goal >= 2.5x) and DualPath/Oracle (goal within 15%), but
only when the three runs did the same work (``bench.compare``: otherwise it says why and exits 1).

    .venv/bin/python benchmarks/dualpath_throughput.py [--tiny] [--agents 16] [--turns 8] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time

from dualpath.bench.compare import compare
from dualpath.bench.config import BenchConfig
from dualpath.bench.runner import BenchRun
from dualpath.bench.systems import measure_system
from dualpath.runtime.cluster.config import ClusterConfig, SchedulerServiceConfig, TrafficConfig
from dualpath.runtime.cluster.demo import ServedCluster


def steady_tokens_per_s(run: BenchRun, warmup_s: float, window_s: float) -> float | None:
    """Tokens generated in [warmup_s, min(warmup_s + window_s, first agent's end)] per second;
    None when the first agent ends before the warm-up does."""
    ends = [v for v in run.jct_s.values() if v is not None]
    end = min([warmup_s + window_s, *ends])
    if end <= warmup_s:
        return None
    times = [(r.sent_s or 0.0) + t for r in run.results if r.ok for t in r.token_times_s]
    return sum(1 for t in times if warmup_s <= t < end) / (end - warmup_s)


def _system(
    served: ServedCluster, args: argparse.Namespace, name: str, seed: int, snic: float | None
) -> dict:
    served.configure(name, snic_gbps=snic)
    cfg = BenchConfig(
        url=served.url,
        num_agents=args.agents,
        maxlen=args.max_len,
        max_turns=args.turns,
        length_scale=args.scale,
        token_seed=seed,
        request_timeout_s=1800.0,
        duration_s=7200.0,
    )
    run, row = asyncio.run(measure_system(cfg, settle_s=0.5))
    row["jct_tokens_per_s"] = row["generated_tokens"] / row["jct_s"]
    row["steady_tokens_per_s"] = steady_tokens_per_s(run, args.warmup_s, args.window_s)
    row["tokens_per_s"] = row[f"{args.mode}_tokens_per_s"] or row["jct_tokens_per_s"]
    row["_run"] = run
    return row


def _run(served: ServedCluster, args: argparse.Namespace) -> dict:
    rows = {"oracle": _system(served, args, "oracle", 1, None)}
    o = rows["oracle"]
    read_rate = (o["bytes_by_path"]["pe-read"] + o["bytes_by_path"]["de-read"]) / o["jct_s"]
    snic_gbps = read_rate / args.balance * 8 / 1e9
    for i, name in enumerate(("basic", "dualpath")):
        rows[name] = _system(served, args, name, 2 + i, snic_gbps)
    runs = {k: r.pop("_run") for k, r in rows.items()}
    return {"snic_gbps": snic_gbps, "rows": rows, "comparison": compare(runs, rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="small random model (default SmolLM2-135M)")
    ap.add_argument("--agents", type=int, default=48)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--scale", type=float, default=1 / 16)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--balance", type=float, default=3.0, help="k in B = R / (k * T_oracle)")
    ap.add_argument("--transport", default="zmq")
    ap.add_argument("--mode", choices=("steady", "jct"), default="steady", help="throughput the ratios use")
    ap.add_argument("--warmup-s", type=float, default=8.0)
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = "tiny" if args.tiny else "smollm2-135m"
    cfg = ClusterConfig(
        kv_dir=tempfile.mkdtemp(prefix="dualpath-bench-kv-"),
        model=model,
        num_prefill_engines=1,
        num_decode_engines=2,
        transport=args.transport,
        traffic=TrafficConfig(snic_gbps=100.0),
        scheduler=SchedulerServiceConfig(engine_timeout_s=60.0),
    )
    t0 = time.monotonic()
    try:
        with ServedCluster(cfg) as served:
            out = _run(served, args)
    finally:
        shutil.rmtree(cfg.kv_dir, ignore_errors=True)
    rows = out["rows"]
    tput = {k: r["tokens_per_s"] for k, r in rows.items()}
    result = {
        "model": model,
        "mode": args.mode,
        "agents": args.agents,
        "turns": args.turns,
        "snic_gbps_per_node": out["snic_gbps"],
        "throughput_tok_per_s": tput,
        "jct_s": {k: r["jct_s"] for k, r in rows.items()},
        "steady_window_empty": [k for k, r in rows.items() if r["steady_tokens_per_s"] is None],
        "errors": {k: len(r["errors"]) for k, r in rows.items()},
        "snic_read_bytes": {k: r["snic_read_bytes"] for k, r in rows.items()},
        "comparison": out["comparison"].as_dict(),  # (bench/compare.py: no ratio over different work)
        "dualpath_over_basic": tput["dualpath"] / tput["basic"] if out["comparison"].same_work else None,
        "dualpath_over_oracle": tput["dualpath"] / tput["oracle"] if out["comparison"].same_work else None,
        "wall_s": time.monotonic() - t0,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        sys.exit(0 if out["comparison"].same_work else 1)
    for line in out["comparison"].problems:
        print(f"NOT COMPARABLE: {line}")
    for line in out["comparison"].noise:
        print(f"NOISE: {line}")
    print(
        f"model {model}, 1P2D, {args.agents} agents x <= {args.turns} turns, "
        f"storage NIC cap {out['snic_gbps']:.4f} Gbps/node (B = oracle read rate / {args.balance}), "
        f"mode {args.mode}"
    )
    for k in ("basic", "dualpath", "oracle"):
        print(
            f"  {k:9s} throughput {tput[k]:8.1f} tok/s  SNIC reads MB "
            f"{ ({n: round(v / 1e6, 1) for n, v in rows[k]['snic_read_bytes'].items()}) }"
        )
    if not out["comparison"].same_work:
        print("No throughput ratio: the systems did different work (above).")
        sys.exit(1)
    print(f"DualPath / Basic throughput: {result['dualpath_over_basic']:.2f}x (ideal 3x, goal >= 2.5x)")
    print(f"DualPath / Oracle throughput: {result['dualpath_over_oracle']:.2f} (goal >= 0.85)")


if __name__ == "__main__":
    main()

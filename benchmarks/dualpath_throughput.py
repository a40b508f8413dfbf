"""DualPath vs Basic vs Oracle throughput on a real local 1P2D cluster with storage NICs binding.

Method (one cluster, reconfigured between systems; each system replays the same agents with fresh
tokens, so nobody hits another system's blocks). Default ``--mode steady``: a closed loop where
each agent repeats its trajectory; throughput = generated tokens finished inside a measurement
window after a warm-up (no start-up or tail effects). ``--mode jct``: one pass, throughput =
generated tokens / JCT (includes the tail of the longest agent).
1. Oracle (reads and PD transfers free) gives the compute-bound throughput and the storage read
   rate ``r`` (bytes/s of hit KV) it would need.
2. The per-node storage-NIC cap is set to ``B = r / k`` with k = 3 (``--balance``): three nodes'
   SNICs together can just feed the Oracle's rate, one SNIC cannot (Basic reads only on the
   prefill node, so it gets about 1/k of it). This is the paper's setting: storage bandwidth binds
   for Basic, and pooling every node's SNIC removes the bottleneck.
3. Basic and DualPath run under that cap.
Prints DualPath/Basic (ideal 3x at 1P2D, goal >= 2.5x) and DualPath/Oracle (goal within 15%).

    .venv/bin/python benchmarks/dualpath_throughput.py [--tiny] [--agents 16] [--turns 8] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time

from dualpath.bench.agents import scaled_turns
from dualpath.runtime.cluster.agents import AgentPlan, closed_loop, metrics_delta, run_system
from dualpath.runtime.cluster.client import ClusterClient
from dualpath.runtime.cluster.config import ClusterConfig, SchedulerServiceConfig, TrafficConfig
from dualpath.runtime.cluster.demo import SYSTEMS
from dualpath.runtime.cluster.local import LocalCluster


async def _system(
    client: ClusterClient,
    agents: list,
    args: argparse.Namespace,
    name: str,
    seed: int,
    snic_gbps: float | None,
) -> dict:
    policy, free = SYSTEMS[name]
    if args.mode == "jct":
        row = await run_system(
            client, agents, policy=policy, read_free=free, seed=seed, settle_s=0.5, snic_gbps=snic_gbps
        )
        row["tokens_per_s"] = row["generated_tokens"] / row["jct_s"]
        row["seconds"] = row["jct_s"]
        return row
    await client.configure(policy, read_free=free, snic_gbps=snic_gbps)
    info = await client.info()
    loop = asyncio.create_task(
        closed_loop(
            client,
            agents,
            vocab_size=info.vocab_size,
            seed=seed,
            warmup_s=args.warmup_s,
            window_s=args.window_s,
        )
    )
    await asyncio.sleep(args.warmup_s)
    before = await client.metrics()
    await asyncio.sleep(args.window_s)
    after = await client.metrics()
    row = dict(await loop)
    delta = metrics_delta(before, after)
    row["bytes_by_path"] = delta["bytes_by_path"]
    row["snic_read_bytes"] = {
        k.split("/")[0]: v for k, v in delta["bytes_by_nic"].items() if k.endswith(":read")
    }
    row["seconds"] = args.window_s
    return row


async def _run(address: str, agents: list, args: argparse.Namespace) -> dict:
    async with ClusterClient(address, query_timeout_s=60.0) as client:
        rows = {"oracle": await _system(client, agents, args, "oracle", 1, None)}
        o = rows["oracle"]
        read_rate = (o["bytes_by_path"]["pe-read"] + o["bytes_by_path"]["de-read"]) / o["seconds"]
        snic_gbps = read_rate / args.balance * 8 / 1e9
        for i, name in enumerate(("basic", "dualpath")):
            rows[name] = await _system(client, agents, args, name, 2 + i, snic_gbps)
        return {"snic_gbps": snic_gbps, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="small random model (default SmolLM2-135M)")
    ap.add_argument("--agents", type=int, default=48)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--scale", type=float, default=1 / 16)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--balance", type=float, default=3.0, help="k in B = R / (k * T_oracle)")
    ap.add_argument("--transport", default="zmq")
    ap.add_argument("--mode", choices=("steady", "jct"), default="steady")
    ap.add_argument("--warmup-s", type=float, default=8.0)
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = "tiny" if args.tiny else "smollm2-135m"
    agents = [
        AgentPlan(agent_id=a, turns=t)
        for a, t in scaled_turns(args.agents, max_len=args.max_len, max_turns=args.turns, scale=args.scale)
    ]
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
        with LocalCluster(cfg) as cluster:
            out = asyncio.run(_run(cluster.address, agents, args))
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
        "snic_read_bytes": {k: r["snic_read_bytes"] for k, r in rows.items()},
        "dualpath_over_basic": tput["dualpath"] / tput["basic"],
        "dualpath_over_oracle": tput["dualpath"] / tput["oracle"],
        "wall_s": time.monotonic() - t0,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
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
    print(f"DualPath / Basic throughput: {result['dualpath_over_basic']:.2f}x (ideal 3x, goal >= 2.5x)")
    print(f"DualPath / Oracle throughput: {result['dualpath_over_oracle']:.2f} (goal >= 0.85)")


if __name__ == "__main__":
    main()

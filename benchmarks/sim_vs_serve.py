"""The simulator against our own cluster: measured vs simulated on a real local 1P2D ``dualpath serve``.

In one run: (1) profile the engine (``dualpath simulate profile``, in a child process so its memory
is gone before the cluster starts; or ``--profile FILE``); (2) start one local cluster of that
model behind the HTTP API (``runtime.cluster.demo.ServedCluster``, as ``dualpath demo``), its PEs'
compute-quota line fixed to the profile's (so both batch with the same predictor), and for each
storage-NIC cap in ``--caps`` run ``dualpath demo``'s agents under Basic, DualPath and Oracle
(each one ``dualpath bench`` run, fresh tokens per run so nobody hits another run's blocks);
(3) simulate the same agents on the local cluster (``sim/local.py``) with the profile as the
engines' step times. Nothing is fitted to the measurements: only the profile and the caps go in.

Printed per cap and system: JCT, mean TTFT, mean TPOT, KV bytes per path and the storage-NIC read
balance (max / mean over nodes), measured and simulated and their ratio, and the Basic / DualPath
and DualPath / Oracle JCT ratios. The issue's goal (on a quiet machine): simulated JCT within 15%
of measured, both ratios within 10%. On a shared machine the engines get only part of the cores:
each run also samples the other runnable threads (``Background``), and the agents are simulated a
second time beside that many (``LocalClusterSpec.background_threads``: a measured input, nothing
fitted), ``simulated_at_load`` in the JSON. A run with a failed request is reported and the
command exits 1 (its numbers are not a result). Every real-cluster run holds the memory lock:

    flock /tmp/dualpath-mem.lock python benchmarks/sim_vs_serve.py [--tiny] [--caps 0.1,0.2] [--out DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from dualpath.bench.config import BenchConfig
from dualpath.bench.systems import measure_system
from dualpath.cli.sim_local import local_trajectories, simulate_local
from dualpath.sim import local
from dualpath.spec.engine_profile import EngineProfile

SYSTEMS = ("basic", "dualpath", "oracle")
PATHS = ("pe-read", "de-read", "pd-transfer", "persist")
RATIOS = {"basic/dualpath": ("basic", "dualpath"), "dualpath/oracle": ("dualpath", "oracle")}
SIMS = {"simulated": "a quiet machine", "simulated_at_load": "the measured background"}
GOAL_JCT, GOAL_RATIO = 0.15, 0.10
# What the simulation is given and what it never sees (the JSON's "inputs"; nothing is fitted)
INPUTS = {
    "fitted_to": [],
    "given": [
        "the engine profile: step times measured by `dualpath simulate profile` on this machine "
        "(single-request prefill grid, decode grid, admission, the per-request batch term)",
        "the storage-NIC cap of each setting (--caps) and the runtime's defaults (LocalClusterSpec: "
        "fetch tick, block size, KV pools by the runtime's --kv-cache-memory auto rule, beta, budget)",
        "simulated_at_load only: the mean other runnable threads sampled during each measured run",
    ],
    "never_seen": [
        "any measured JCT, TTFT, TPOT, byte count or SNIC balance of the cluster runs",
        "the engine processes' measured CPU seconds (reported beside the simulated compute only)",
    ],
}
DEFAULT_CAPS = {"smollm2-135m": "0.1,0.2", "tiny": "0.01,0.02"}  # Gbit/s per node (demo: 0.1 / 0.01)


def say(msg: str, t0: float = time.monotonic()) -> None:
    print(f"[{time.monotonic() - t0:6.0f} s] {msg}", file=sys.stderr, flush=True)


def get_profile(args: argparse.Namespace, work: str) -> tuple[EngineProfile, str]:
    if args.profile:
        return EngineProfile.load(args.profile), args.profile
    path = os.path.join(work, "profile.json")
    say(f"profiling the {args.model} engine (a child process)")
    cmd = [sys.executable, "-m", "dualpath.cli", "simulate", "profile", "--model", args.model, "--out", path]
    subprocess.run(cmd, check=True)
    return EngineProfile.load(path), path


class Background:
    """The machine's other work while a run goes on: every 0.1 s, the runnable threads the kernel
    counts (``/proc/loadavg``'s fourth field) less the engines' runnable threads and this sampler;
    ``mean()`` over the run (0 on a quiet machine)."""

    def __init__(self, engine_pids: list[int], period_s: float = 0.1) -> None:
        self.pids, self.period_s, self.samples = engine_pids, period_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Background:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            with open("/proc/loadavg", encoding="ascii") as fh:
                running = int(fh.read().split()[3].split("/")[0])
            self.samples.append(max(0, running - 1 - sum(map(_runnable_threads, self.pids))))

    def mean(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else 0.0


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _runnable_threads(pid: int) -> int:
    n = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as fh:
                n += fh.read().rsplit(")", 1)[1].split()[0] == "R"
    except OSError:  # (a thread or the process went away between the calls)
        pass
    return n


def bench_config(args: argparse.Namespace, url: str, token_seed: int) -> BenchConfig:
    return BenchConfig(
        url=url, dataset_name="agents", num_agents=args.agents, maxlen=args.max_len, max_turns=args.turns,
        length_scale=args.scale, seed=0, token_seed=token_seed, request_timeout_s=900.0, duration_s=3600.0,
    )  # fmt: skip


def measure(args: argparse.Namespace, profile: EngineProfile, caps: list[float]) -> dict[float, dict]:
    """Every (cap, system) on one served cluster; {cap: {system: measured row}}."""
    from dualpath.runtime.cluster import config as rc
    from dualpath.runtime.cluster.demo import ServedCluster
    from dualpath.runtime.server.config import ServerConfig

    cfg = rc.ClusterConfig(
        kv_dir=tempfile.mkdtemp(prefix="dualpath-simvserve-kv-"), model=args.model, num_prefill_engines=1,
        num_decode_engines=2, traffic=rc.TrafficConfig(snic_gbps=caps[0]),
        scheduler=rc.SchedulerServiceConfig(engine_timeout_s=30.0),
        engine=rc.EngineConfig(attention_s_per_gflop=profile.attention_s_per_gflop,
                               attention_intercept_s=profile.attention_intercept_s),
    )  # fmt: skip
    out: dict[float, dict] = {}
    say("starting the 1P2D cluster")
    with ServedCluster(cfg, ServerConfig(token_timeout_s=900.0, cluster_query_timeout_s=30.0)) as served:
        for k, cap in enumerate(caps):
            out[cap] = {}
            for i, name in enumerate(SYSTEMS):
                say(f"measuring {name} at {cap:g} Gbit/s per SNIC")
                served.configure(name, snic_gbps=cap)
                pids = [served.cluster.engine_procs[e].pid for e in sorted(served.cluster.engine_procs)]
                cpu0 = [_cpu_s(p) for p in pids]
                with Background(pids) as bg:
                    run, row = asyncio.run(measure_system(bench_config(args, served.url, 10 * k + i + 1)))
                cpu = [_cpu_s(p) - c for p, c in zip(pids, cpu0, strict=True)]
                out[cap][name] = measured_row(run, row) | {
                    "background_threads": bg.mean(),
                    "engine_cpu_s": cpu,
                }
    return out


def measured_row(run: Any, row: dict) -> dict:
    tpot = [r.tpot_s for r in run.results if r.ok and r.tpot_s is not None]
    nodes = [row["snic_read_bytes"].get(f"node{i}", 0) for i in range(3)]
    return {
        "jct_s": row["jct_s"],
        "ttft_s": row["ttft_mean_s"],
        "tpot_s": sum(tpot) / len(tpot) if tpot else None,
        "requests": row["num_requests"],
        "errors": row["errors"],
        "bytes": {p: row["bytes_by_path"].get(p, 0) for p in PATHS},
        "snic_read_bytes_by_node": nodes,
        "snic_read_max_over_avg": _max_over_avg(nodes),
    }


def simulate(
    args: argparse.Namespace, profile: EngineProfile, measured: dict[float, dict]
) -> dict[float, dict]:
    """{cap: {system: {"simulated": quiet machine, "simulated_at_load": beside the background
    its measured run saw}}}."""
    trajs = local_trajectories(
        agents=args.agents, max_turns=args.turns, scale=args.scale, max_len=args.max_len, seed=0
    )
    prompt_bytes = sum(_prompt_tokens(t) for t in trajs) * profile.kv_bytes_per_token
    out: dict[float, dict] = {}
    for cap, rows in measured.items():
        out[cap] = {}
        for name in SYSTEMS:
            out[cap][name] = {}
            for sim, bg in (("simulated", 0.0), ("simulated_at_load", rows[name]["background_threads"])):
                spec = local.LocalClusterSpec(snic_gbps=cap, background_threads=bg)
                out[cap][name][sim] = simulated_row(
                    simulate_local([name], spec, profile, trajs)[name], prompt_bytes
                )
    return out


def _prompt_tokens(traj: Any) -> int:
    total, context = 0, 0
    for turn in traj.turns:
        total += context + turn.append_len
        context += turn.append_len + turn.gen_len
    return total


def simulated_row(r: dict, prompt_bytes: float) -> dict:
    b = r["bytes"]
    # PD transfers: PE -> DE sends plus DE-path loads = the DE CNICs' KV bytes less the DE buffer ->
    # HBM copies (each prompt once on tx and rx), which the runtime does not send (Oracle: none)
    pd = b.get("de_cnic_tx", 0.0) + b.get("de_cnic_rx", 0.0)
    nodes = r["snic_read_bytes_by_node"]
    return {
        "jct_s": r["jct_s"],
        "ttft_s": r["mean_ttft_s"],
        "tpot_s": r["mean_tpot_s"],
        "requests": r["num_requests"],
        "bytes": {
            "pe-read": b.get("pe_snic_read", 0.0),
            "de-read": b.get("de_snic_read", 0.0),
            "pd-transfer": max(0.0, pd - 2 * prompt_bytes) if pd else 0.0,
            "persist": b.get("de_snic_write", 0.0),
        },
        "snic_read_bytes_by_node": nodes,
        "snic_read_max_over_avg": _max_over_avg(nodes),
        "engine_cpu_s": r["engine_compute_s"],  # (the engines' compute; measured: their processes' CPU)
    }


def _max_over_avg(values: list[float]) -> float | None:
    avg = sum(values) / len(values) if values else 0.0
    return max(values) / avg if avg > 0 else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def compare(measured: dict[float, dict], simulated: dict[float, dict]) -> dict[str, Any]:
    """Per cap: each system's measured and simulated rows, and the JCT ratios of each."""
    out: dict[str, Any] = {}
    for cap, rows in measured.items():
        entry: dict[str, Any] = {n: {"measured": rows[n], **simulated[cap][n]} for n in SYSTEMS}
        entry["ratios"] = {}
        for key, (a, b) in RATIOS.items():
            r = {"measured": _ratio(rows[a]["jct_s"], rows[b]["jct_s"])}
            for sim in SIMS:
                r[sim] = _ratio(entry[a][sim]["jct_s"], entry[b][sim]["jct_s"])
                r[f"{sim}_over_measured"] = _ratio(r[sim], r["measured"])
            entry["ratios"][key] = r
        out[f"{cap:g}"] = entry
    return out


def goals(result: dict[str, Any], sim: str) -> dict[str, bool]:
    jct = [_ratio(e[n][sim]["jct_s"], e[n]["measured"]["jct_s"]) for e in result.values() for n in SYSTEMS]
    ratio = [r[f"{sim}_over_measured"] for e in result.values() for r in e["ratios"].values()]
    return {
        "jct_within_15pct": all(x is not None and abs(x - 1) <= GOAL_JCT for x in jct),
        "ratios_within_10pct": all(x is not None and abs(x - 1) <= GOAL_RATIO for x in ratio),
    }


def print_tables(result: dict[str, Any]) -> None:
    cols = ("JCT s", "TTFT s", "TPOT ms", "pe-read MB", "de-read MB", "pd MB", "persist MB", "SNIC max/avg")
    for cap, e in result.items():
        for sim, what in SIMS.items():
            print(f"\nSNIC cap {cap} Gbit/s per node: measured / simulated on {what} (sim / measured)")
            print(f"{'system':10s}{'bg thr':>7s}" + "".join(f"{c:>24s}" for c in cols))
            for n in SYSTEMS:
                m, s = e[n]["measured"], e[n][sim]
                cells = [_cell(m["jct_s"], s["jct_s"]), _cell(m["ttft_s"], s["ttft_s"]),
                         _cell(m["tpot_s"], s["tpot_s"], 1e3)]  # fmt: skip
                cells += [_cell(m["bytes"][p], s["bytes"][p], 1e-6) for p in PATHS]
                cells.append(_cell(m["snic_read_max_over_avg"], s["snic_read_max_over_avg"]))
                print(f"{n:10s}{m['background_threads']:7.1f}" + "".join(f"{c:>24s}" for c in cells))
            for key, r in e["ratios"].items():
                x = r[f"{sim}_over_measured"]
                print(f"  {key} JCT: measured {r['measured']:.3f}, simulated {r[sim]:.3f} (x{x:.3f})")
        cpu = "; ".join(
            f"{n} "
            + ", ".join(
                f"{m:.1f}/{s:.1f}"
                for m, s in zip(e[n]["measured"]["engine_cpu_s"], e[n]["simulated"]["engine_cpu_s"])
            )
            for n in SYSTEMS
        )
        print(f"  engine CPU s, PE, DE, DE (measured process CPU / simulated compute): {cpu}")


def _cell(m: float | None, s: float | None, scale: float = 1.0) -> str:
    if m is None or s is None:
        return f"{'-' if m is None else f'{m * scale:.3g}'} / {'-' if s is None else f'{s * scale:.3g}'}"
    return f"{m * scale:.3g} / {s * scale:.3g} ({f'x{s / m:.2f}' if m else '-'})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the tiny random model (a quick check)")
    ap.add_argument("--caps", default=None, help="storage-NIC caps, Gbit/s per node (comma list)")
    ap.add_argument("--agents", type=int, default=local.DEMO_AGENTS)
    ap.add_argument("--turns", type=int, default=local.DEMO_TURNS)
    ap.add_argument("--scale", type=float, default=local.DEMO_SCALE)
    ap.add_argument("--max-len", type=int, default=local.DEMO_MAX_LEN)
    ap.add_argument("--profile", default=None, help="use this engine profile instead of measuring one")
    ap.add_argument("--out", default=None, help="folder for profile.json (the one measured) and result.json")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.model = "tiny" if args.tiny else "smollm2-135m"
    caps = [float(c) for c in (args.caps or DEFAULT_CAPS[args.model]).split(",")]
    started, loads = time.monotonic(), {"start": os.getloadavg()}
    work = args.out or tempfile.mkdtemp(prefix="dualpath-simvserve-")
    os.makedirs(work, exist_ok=True)
    profile, profile_path = get_profile(args, work)
    loads["profiled"] = os.getloadavg()
    measured = measure(args, profile, caps)
    loads["measured"] = os.getloadavg()
    say("simulating the same agents on the profile")
    result = compare(measured, simulate(args, profile, measured))
    errors = {
        f"{c:g}/{n}": rows[n]["errors"] for c, rows in measured.items() for n in SYSTEMS if rows[n]["errors"]
    }
    out = {
        "model": args.model,
        "workload": {
            "agents": args.agents,
            "turns": args.turns,
            "scale": args.scale,
            "max_len": args.max_len,
        },
        "profile": {"path": profile_path, "host": profile.host, "created": profile.created},
        "inputs": INPUTS,
        "caps": result,
        "goals": goals(result, "simulated"),
        "goals_at_load": goals(result, "simulated_at_load"),
        "errors": errors,
        "wall_s": time.monotonic() - started,
        "load_average": loads,
    }
    with open(os.path.join(work, "result.json"), "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=2)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print("simulation inputs (nothing fitted): " + "; ".join(INPUTS["given"]))
        print("never seen by the simulation: " + "; ".join(INPUTS["never_seen"]))
        print_tables(result)
        lavg = ", ".join(f"{k} {v[0]:.1f}" for k, v in loads.items())
        print(
            f"\ngoals (quiet / at load): {out['goals']} / {out['goals_at_load']}; wall {out['wall_s']:.0f} s;"
        )
        print(f"1-min load average {lavg}; files in {work}")
    if errors:
        print(f"failed requests, the numbers above are not a result: {errors}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Simulator speed against the issue's goals (one core), pure Python and mypyc-compiled.

Goal 1: DS 660B 2P4D, 2,048 agents, 64K, systems basic+dualpath+oracle, in < 20 s wall.
Goal 2: DS 660B 48P96D, 48K agents (49,152 = 24 x the 2P4D unit's 2,048), DualPath, < 3 min wall.
Prints wall and CPU seconds (CPU time is the fair measure on a shared machine), simulated requests
per wall second, the ratio to each goal (< 1 = met), and the Vidur reference rate (~140 req/s on
this machine) for comparison.

    python benchmarks/sim_speed.py [--quick] [--skip-large] [--build pure|compiled|both]

``--build compiled`` / ``both`` first builds a mypyc-compiled copy of this checkout in a temporary
folder (``dualpath.sim.compiled.build_copy``, ~30 s, not timed) and runs the goals there in a
child process; ``both`` also runs them in pure Python and prints compiled / pure speed-ups. Both
builds must give the same JCTs (checked). ``--quick``: 1/8 of the agents against 1/8 of the goals.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

VIDUR_REQ_PER_S = 140.0


def _run(pd: str, agents: int, systems: list[str]) -> dict:
    from dualpath.sim.harness.experiments import WorkloadSpec, make_cluster, make_trajectories
    from dualpath.sim.harness.runner import run_systems

    trajs = make_trajectories(WorkloadSpec(maxlen=65536, num_agents=agents, seed=0))
    start, cpu0 = time.perf_counter(), time.process_time()
    res = run_systems(systems, make_cluster("deepseek-v3.2", pd), trajs)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "requests": sum(r["num_requests"] for r in res.values()),
        "jct_s": {k: v["jct_s"] for k, v in res.items()},
    }


def _goals(args: argparse.Namespace) -> list[tuple[str, int, list[str], float]]:
    scale = 8 if args.quick else 1
    goals = [("2p4d", 2048 // scale, ["basic", "dualpath", "oracle"], 20.0 / scale)]
    if not args.skip_large:
        n = args.large_agents // scale
        goals.append(("48p96d", n, ["dualpath"], 180.0 * n / (48 * 1024)))
    return goals


def _measure(args: argparse.Namespace) -> list[dict]:
    from dualpath.sim import compiled

    build = "compiled" if compiled.is_compiled() else "pure"
    out = []
    for pd, agents, systems, goal_s in _goals(args):
        row = {"build": build, "pd": pd, "agents": agents, "goal_s": goal_s, **_run(pd, agents, systems)}
        _print(row)
        out.append(row)
    return out


def _print(row: dict) -> None:
    rate = row["requests"] / row["wall_s"]
    jcts = ", ".join(f"{k} {v:.0f}s" for k, v in row["jct_s"].items())
    print(
        f"[{row['build']}] {row['pd']} {row['agents']} agents [{jcts}]: wall {row['wall_s']:.1f} s, "
        f"CPU {row['cpu_s']:.1f} s (goal {row['goal_s']:.1f} s, ratio {row['wall_s'] / row['goal_s']:.2f} "
        f"wall, {row['cpu_s'] / row['goal_s']:.2f} CPU), {row['requests']} requests, {rate:.0f} "
        f"simulated req/s ({rate / VIDUR_REQ_PER_S:.0f}x Vidur's ~{VIDUR_REQ_PER_S:.0f} req/s)",
        flush=True,
    )


def _compiled_rows(args: argparse.Namespace) -> list[dict]:
    from dualpath.sim.compiled import build_copy

    with tempfile.TemporaryDirectory(prefix="dualpath-mypyc-") as tmp:
        print(f"building a mypyc-compiled copy in {tmp} (not timed) ...", flush=True)
        src = build_copy(tmp)
        child = [sys.executable, os.path.abspath(__file__), "--build", "pure", "--json-rows"]
        child += ["--quick"] * args.quick + ["--skip-large"] * args.skip_large
        child += ["--large-agents", str(args.large_agents)]
        env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
        proc = subprocess.run(child, env=env, cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"compiled run failed:\n{proc.stdout}\n{proc.stderr}")
        rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if not rows or any(r["build"] != "compiled" for r in rows):
        raise SystemExit("the child process did not run the compiled modules")
    for row in rows:
        _print(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-large", action="store_true", help="only goal 1")
    parser.add_argument(
        "--large-agents",
        type=int,
        default=48 * 1024,
        help="agents for goal 2 (the goal is scaled by agents / 49,152)",
    )
    parser.add_argument(
        "--build",
        choices=("pure", "compiled", "both"),
        default="pure",
        help="pure: this process as installed; compiled: a mypyc build of this "
        "checkout; both: each, with compiled / pure speed-ups",
    )
    parser.add_argument("--json-rows", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json_rows:  # child of --build compiled: one JSON object per goal
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            rows = _measure(args)
        for row in rows:
            print(json.dumps(row))
        return
    pure = _measure(args) if args.build in ("pure", "both") else []
    fast = _compiled_rows(args) if args.build in ("compiled", "both") else []
    for p, c in zip(pure, fast):
        if p["jct_s"] != c["jct_s"]:
            raise SystemExit(f"{p['pd']}: compiled JCTs {c['jct_s']} differ from pure {p['jct_s']}")
        print(
            f"{p['pd']} {p['agents']} agents: compiled / pure speed-up {p['cpu_s'] / c['cpu_s']:.2f}x CPU, "
            f"{p['wall_s'] / c['wall_s']:.2f}x wall (same JCTs)"
        )


if __name__ == "__main__":
    main()

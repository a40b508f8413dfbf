"""Simulator speed against the issue's goals (one core).

Goal 1: DS 660B 2P4D, 2,048 agents, 64K, systems basic+dualpath+oracle, in < 20 s wall.
Goal 2: DS 660B 48P96D, 48K agents (49,152 = 24 x the 2P4D unit's 2,048), DualPath, < 3 min wall.
Prints wall and CPU seconds (CPU time is the fair measure on a shared machine), simulated requests per wall second, and the ratio to each goal (< 1 = met),
plus the Vidur reference rate (~140 req/s on this machine) for comparison.

    python benchmarks/sim_speed.py [--quick]   (--quick: 1/8 of the agents, goals scaled likewise)
"""

from __future__ import annotations

import argparse
import time

VIDUR_REQ_PER_S = 140.0


def _run(pd: str, agents: int, systems: list[str]) -> tuple[float, float, int, dict]:
    from dualpath.sim.experiments import WorkloadSpec, make_cluster, make_trajectories
    from dualpath.sim.runner import run_systems

    trajs = make_trajectories(WorkloadSpec(maxlen=65536, num_agents=agents, seed=0))
    start, cpu0 = time.perf_counter(), time.process_time()
    res = run_systems(systems, make_cluster("deepseek-v3.2", pd), trajs)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    return wall, cpu, sum(r["num_requests"] for r in res.values()), res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-large", action="store_true", help="only goal 1")
    parser.add_argument("--large-agents", type=int, default=48 * 1024,
                        help="agents for goal 2 (the goal is scaled by agents / 49,152)")
    args = parser.parse_args()
    scale = 8 if args.quick else 1
    goals = [("2p4d", 2048 // scale, ["basic", "dualpath", "oracle"], 20.0 / scale)]
    if not args.skip_large:
        n = args.large_agents // scale
        goals.append(("48p96d", n, ["dualpath"], 180.0 * n / (48 * 1024)))
    for pd, agents, systems, goal_s in goals:
        wall, cpu, reqs, res = _run(pd, agents, systems)
        rate = reqs / wall
        jcts = ", ".join(f"{k} {v['jct_s']:.0f}s" for k, v in res.items())
        print(f"{pd} {agents} agents [{jcts}]: wall {wall:.1f} s, CPU {cpu:.1f} s (goal {goal_s:.1f} s, "
              f"ratio {wall / goal_s:.2f} wall, {cpu / goal_s:.2f} CPU), {reqs} requests, "
              f"{rate:.0f} simulated req/s "
              f"({rate / VIDUR_REQ_PER_S:.0f}x Vidur's ~{VIDUR_REQ_PER_S:.0f} req/s)")


if __name__ == "__main__":
    main()

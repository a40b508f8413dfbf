"""Planner speed against issue 11's goal (section 12), printed as ratios, never asserted.

Goal: one ``dualpath plan disagg --model M --catalog npu --io 100`` (four modes, both phases,
top-K simulated, at the defaults: short list 16, top-K 64, partner-batch sigma) in <= 30 s on one
core, for each of the paper's eight models (``--catalog gpu`` for the GPU catalogue). For
comparison, AIConfigurator's full agg + disagg search measured 11.7 s (Qwen3-32B) and 75 s
(DeepSeek-V3) on this machine; the ratio to each is printed (< 1 = faster than AIConfigurator).

    python benchmarks/planner_speed.py [--models all|a,b] [--io 100] [--catalog npu] [--top-k K]
        [--shortlist N]

Prints, per model: wall and CPU seconds of one plan, the ratio to the 30 s goal, the simulated
events and events per CPU second, and the two AIConfigurator ratios; then the totals. CPU time is
the fair measure on a shared machine (the planner is single-threaded). ``--json`` prints one object.
"""

from __future__ import annotations

import argparse
import json
import time

GOAL_S = 30.0
AICONFIGURATOR_S = {"qwen3-32b": 11.7, "deepseek-v3": 75.0}


def events_of(result: dict) -> int:
    """Simulated events of one plan (every simulated allocation of every mode)."""
    return int(result["search"].get("events", 0))


def measure(
    model: str,
    io: float,
    catalog: str,
    top_k: int | None,
    shortlist: int | None = None,
    budget_scale: float | None = None,
) -> dict:
    from dualpath.planner.api import PlanConfig, plan_disagg

    given = (("top_k", top_k), ("shortlist", shortlist), ("budget_scale", budget_scale))
    kwargs = {k: v for k, v in given if v is not None}
    config = PlanConfig(model=model, catalog=catalog, io_ratio=io, **kwargs)  # type: ignore[arg-type]
    start, cpu0 = time.perf_counter(), time.process_time()
    result = plan_disagg(config)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    events = events_of(result)
    return {
        "model": model,
        "wall_s": wall,
        "cpu_s": cpu,
        "goal_ratio": cpu / GOAL_S,
        "events": events,
        "events_per_cpu_s": events / cpu if cpu > 0 else None,
        "simulated": result["search"]["simulated"],
        "stopped_early": result["search"].get("stopped_early", 0),
        "top_k": result["constants"]["top_k"],
        "shortlist": result["constants"]["shortlist"],
        "best_mode": result["best_mode"],
        **{f"x_aiconfigurator_{k}": cpu / v for k, v in AICONFIGURATOR_S.items()},
    }


def main() -> None:
    from dualpath.planner.report import parse_models

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="all")
    ap.add_argument("--io", type=float, default=100.0)
    ap.add_argument("--catalog", default="npu")
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--shortlist", type=int, default=None)
    ap.add_argument("--budget-scale", type=float, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for model in parse_models(args.models):
        row = measure(model, args.io, args.catalog, args.top_k, args.shortlist, args.budget_scale)
        rows.append(row)
        if not args.json:
            print(
                f"{model:18s} wall {row['wall_s']:6.1f} s  cpu {row['cpu_s']:6.1f} s  "
                f"goal ratio {row['goal_ratio']:.2f}  simulated {row['simulated']} "
                f"({row['stopped_early']} stopped early)  events {row['events']:>9d} "
                f"({row['events_per_cpu_s'] or 0:,.0f}/s)  "
                f"x AIConfigurator Qwen3-32B {row['x_aiconfigurator_qwen3-32b']:.2f}, "
                f"DeepSeek-V3 {row['x_aiconfigurator_deepseek-v3']:.2f}  "
                f"best {row['best_mode']}",
                flush=True,
            )
    total_cpu = sum(r["cpu_s"] for r in rows)
    summary = {
        "models": len(rows),
        "max_cpu_s": max(r["cpu_s"] for r in rows),
        "mean_cpu_s": total_cpu / len(rows),
        "max_goal_ratio": max(r["goal_ratio"] for r in rows),
        "events_per_cpu_s": sum(r["events"] for r in rows) / total_cpu if total_cpu else None,
        "goal_s": GOAL_S,
        "aiconfigurator_s": AICONFIGURATOR_S,
    }
    if args.json:
        print(json.dumps({"rows": rows, **summary}, indent=2))
    else:
        print(
            f"max {summary['max_cpu_s']:.1f} s CPU per plan (goal ratio "
            f"{summary['max_goal_ratio']:.2f}; < 1 = met), mean {summary['mean_cpu_s']:.1f} s, "
            f"{summary['events_per_cpu_s'] or 0:,.0f} simulated events per CPU second"
        )


if __name__ == "__main__":
    main()

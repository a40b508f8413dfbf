"""Does raising top-K from 8 to 32 change any winning mode on the figure grid? (issue 11, section 6)

Runs the same sweep twice per catalogue, at ``--top-k-low`` and ``--top-k-high``, and prints each
(model, ratio) whose best mode changed, with both x ND values; then the count. Nothing asserted.

    python benchmarks/planner_topk.py [--catalogs npu,gpu] [--models all] [--io 0.01,1,100]
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> None:
    from dualpath.planner.api import PlanConfig
    from dualpath.planner.report import parse_floats, parse_models, sweep

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--catalogs", default="npu,gpu")
    ap.add_argument("--models", default="all")
    ap.add_argument("--io", default="0.01,0.1,1,10,50,100,200,500,1000")
    ap.add_argument("--top-k-low", type=int, default=8)
    ap.add_argument("--top-k-high", type=int, default=32)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    models, ratios = parse_models(args.models), parse_floats("io", args.io)
    changed, total, report = 0, 0, []
    for catalog in args.catalogs.split(","):
        best = {}
        for k in (args.top_k_low, args.top_k_high):
            base = PlanConfig(
                model=models[0],
                catalog=catalog,
                io_ratio=ratios[0],  # type: ignore[arg-type]
                top_k=k,
            )
            res = sweep(
                base, models, ratios, progress=lambda m, k=k: print(f"  top-K {k}: {m}", file=sys.stderr)
            )
            best[k] = {
                (r["model"], r["io_ratio"]): (r["mode"], r["x_nd"]) for r in res["rows"] if r["is_best"]
            }
        for key, (mode, x) in best[args.top_k_low].items():
            total += 1
            mode_hi, x_hi = best[args.top_k_high].get(key, (None, None))
            if mode_hi != mode:
                changed += 1
                report.append(
                    {
                        "catalog": catalog,
                        "model": key[0],
                        "io_ratio": key[1],
                        "low": [mode, x],
                        "high": [mode_hi, x_hi],
                    }
                )
                print(
                    f"{catalog} {key[0]} I/O={key[1]:g}: {mode} ({x:.3f}) -> {mode_hi} ({x_hi:.3f})",
                    flush=True,
                )
    print(f"{changed} of {total} winning modes change from top-K {args.top_k_low} to {args.top_k_high}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"changed": report, "total": total}, fh, indent=1)


if __name__ == "__main__":
    main()

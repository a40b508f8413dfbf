"""Fit ``budget_scale`` to the paper's NPU model-mean PDAF x ND curve, over admissible scales only.

A scale is admissible only if ND cannot keep up (sigma < 1) at I/O 10 for every model
(``planner.calibrate.admissible_limits``: below ``min_m D_m / W_m``, the demand anchor over the
weight anchor); the scan covers a geometric grid (factor sqrt 2, so the fitted scale's 0.5x and 2x
neighbours are two steps away) below that limit, prints the model-mean PD / AF / PDAF x ND per ratio,
the loss of ``planner.calibrate.fig5_loss`` and ND's sigma at I/O 10 per point, and writes every
point (with its admissibility) as JSON.

    python benchmarks/planner_budget_fit.py [--scales 8,11.3,...] [--models all] \
        [--ratios 1,10,50,100,200,500,1000] [--top-k 64] [--requests 500] [--out fit.json]

Nothing is written into the code: the chosen value goes into ``planner/budget.py`` by hand, with
the run that chose it named in docs/planner.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time


def main() -> None:
    from dualpath.planner.calibrate import FIT_RATIOS, admissible_limit, admissible_limits, best_point, scan
    from dualpath.planner.report import parse_floats, parse_models, ratio_key

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default=None, help="default: sqrt-2 grid, 8 points below the limit")
    ap.add_argument("--models", default="all")
    ap.add_argument("--ratios", default=",".join(f"{r:g}" for r in FIT_RATIOS))
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--out", default="budget_fit.json")
    args = ap.parse_args()
    config = {k: v for k, v in (("top_k", args.top_k), ("num_requests", args.requests)) if v is not None}
    models, ratios = parse_models(args.models), parse_floats("ratios", args.ratios)
    started = time.process_time()
    limits = admissible_limits(models, **{k: v for k, v in config.items() if k == "num_requests"})
    limit = admissible_limit(limits)
    for name, lim in limits.items():
        got = "never reaches 1" if lim["limit_scale"] is None else f"{lim['limit_scale']:.1f}"
        print(f"{name:18s} W {lim['weight_anchor']:9.1f} D {lim['demand_anchor']:11.1f}  D/W {got}")
    print(f"admissible: scale < {limit:.2f}", flush=True)
    if args.scales:
        scales = parse_floats("scales", args.scales)
    else:
        top = math.floor(2 * math.log2(limit)) if math.isfinite(limit) else 14
        scales = tuple(2 ** (k / 2) for k in range(top - 7, top + 1))

    def note(msg: str) -> None:
        print(f"  {msg} ({time.process_time() - started:.0f} s cpu)", file=sys.stderr, flush=True)

    points = []
    for scale in scales:
        point = scan([scale], models=models, ratios=ratios, progress=note, **config)[0]
        point["admissible"] = scale < limit
        points.append(point)
        cells = "  ".join(
            f"{r:g}: "
            + "/".join(
                "-" if (v := point[f"{m}_mean"].get(ratio_key(r))) is None else f"{v:.2f}"
                for m in ("pd", "af", "pdaf")
            )
            for r in ratios
        )
        print(
            f"scale {scale:7.3g} {'ok ' if point['admissible'] else 'NO '} loss {point['loss']:7.3f}  "
            f"PD/AF/PDAF x ND  {cells}",
            flush=True,
        )
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"config": config, "limits": limits, "limit": limit, "points": points}, fh, indent=1)
    best = best_point(points)
    print(
        f"best admissible budget_scale {best['budget_scale']:g} (loss {best['loss']:.3f}); "
        f"{time.process_time() - started:.0f} s cpu; points in {args.out}"
    )


if __name__ == "__main__":
    main()

"""Fit ``budget_scale`` to the paper's NPU model-mean PDAF x ND curve (issue 11, section 11).

Scans a geometric grid of scales (factor sqrt 2, so the fitted scale's 0.5x and 2x neighbours are
two steps away and come from the same run), prints the model-mean PD / AF / PDAF x ND per ratio and
the loss of ``planner.calibrate.fig5_loss`` for each, and writes every point as JSON.

    python benchmarks/planner_budget_fit.py [--scales 1,1.41,2,...] [--models all] \
        [--ratios 1,10,50,100,200,500,1000] [--top-k 8] [--requests 500] [--out fit.json]

Nothing is written into the code: the chosen value goes into ``planner/budget.py`` by hand,
with the run that chose it named in docs/planner.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> None:
    from dualpath.planner.calibrate import FIT_RATIOS, best_point, scan
    from dualpath.planner.report import parse_floats, parse_models, ratio_key

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default=",".join(f"{2 ** (k / 2):.4g}" for k in range(0, 9)))
    ap.add_argument("--models", default="all")
    ap.add_argument("--ratios", default=",".join(f"{r:g}" for r in FIT_RATIOS))
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--out", default="budget_fit.json")
    args = ap.parse_args()
    config = {k: v for k, v in (("top_k", args.top_k), ("num_requests", args.requests)) if v is not None}
    ratios = parse_floats("ratios", args.ratios)
    started = time.process_time()

    def note(msg: str) -> None:
        print(f"  {msg} ({time.process_time() - started:.0f} s cpu)", file=sys.stderr, flush=True)

    points = []
    for scale in parse_floats("scales", args.scales):
        point = scan([scale], models=parse_models(args.models), ratios=ratios, progress=note, **config)[0]
        points.append(point)
        cells = "  ".join(
            f"{r:g}: "
            + "/".join(
                "-" if (v := point[f"{m}_mean"].get(ratio_key(r))) is None else f"{v:.2f}"
                for m in ("pd", "af", "pdaf")
            )
            for r in ratios
        )
        print(f"scale {scale:6.3g}  loss {point['loss']:7.3f}  PD/AF/PDAF x ND  {cells}", flush=True)
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"config": config, "points": points}, fh, indent=1)
    best = best_point(points)
    print(
        f"best budget_scale {best['budget_scale']:g} (loss {best['loss']:.3f}); "
        f"{time.process_time() - started:.0f} s cpu; points in {args.out}"
    )


if __name__ == "__main__":
    main()

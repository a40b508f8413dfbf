"""K sensitivity: do the winning modes and x ND change between two search widths (short list,
top-K), over the whole grid (every ratio, NPU and GPU)? Nothing asserted.

Either compare a figure run's default sweeps with its ``--shortlist 4 --top-k 8`` flag sweeps (no
planning), or plan both widths here:

    python benchmarks/planner_topk.py --from-figures DIR
    python benchmarks/planner_topk.py [--catalogs npu,gpu] [--models all] [--io 0.01,...,1000] \
        [--low 4,8] [--high 16,64] [--out k.json]

Prints each (catalogue, model, ratio) whose best mode changed, with both x ND values, the count of
changed winners, and the median and largest change of each split mode's x ND.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def compare(low: dict, high: dict) -> dict:
    """Winners and x ND of two sweep objects of the same grid."""
    best = {}
    x = {}
    for name, res in (("low", low), ("high", high)):
        best[name] = {(r["model"], r["io_ratio"]): r["mode"] for r in res["rows"] if r["is_best"]}
        x[name] = {(r["model"], r["io_ratio"], r["mode"]): r["x_nd"] for r in res["rows"]}
    changed = [
        {"model": k[0], "io_ratio": k[1], "low": m, "high": best["high"].get(k)}
        for k, m in best["low"].items()
        if best["high"].get(k) != m
    ]
    moves = {}
    for mode in ("pd", "af", "pdaf"):
        d = [
            x["high"][k] / v - 1.0
            for k, v in x["low"].items()
            if k[2] == mode and v and x["high"].get(k) is not None
        ]
        moves[mode] = {
            "median": statistics.median(d) if d else None,
            "max_abs": max(map(abs, d), default=None),
        }
    return {"total": len(best["low"]), "changed": changed, "x_nd_change": moves}


def _k_slug() -> str:
    """The file name stem of the figure run's K variant (figures_flags.Variant.slug)."""
    from dualpath.planner.figures_flags import FLAG_VARIANTS

    return next(v.slug for v in FLAG_VARIANTS if "top_k" in v.overrides)


def _plan(catalog: str, models, ratios, width: tuple[int, int]) -> dict:
    from dualpath.planner.api import PlanConfig
    from dualpath.planner.report import sweep

    base = PlanConfig(
        model=models[0], catalog=catalog, io_ratio=ratios[0], shortlist=width[0], top_k=width[1]
    )  # type: ignore[arg-type]
    return sweep(base, models, ratios, progress=lambda m: print(f"  {width}: {m}", file=sys.stderr))


def main() -> None:
    from dualpath.planner.report import parse_floats, parse_models

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-figures", default=None)
    ap.add_argument("--catalogs", default="npu,gpu")
    ap.add_argument("--models", default="all")
    ap.add_argument("--io", default="0.01,0.1,1,10,50,100,200,500,1000")
    ap.add_argument("--low", default="4,8", help="short list, top-K")
    ap.add_argument("--high", default="16,64")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    report = {}
    for catalog in args.catalogs.split(","):
        if args.from_figures:
            root = Path(args.from_figures)
            low = json.loads((root / "flags" / f"{_k_slug()}_{catalog}.json").read_text())
            high = json.loads((root / f"sweep_{catalog}.json").read_text())
        else:
            models, ratios = parse_models(args.models), parse_floats("io", args.io)
            lo = tuple(int(v) for v in args.low.split(","))
            hi = tuple(int(v) for v in args.high.split(","))
            low, high = _plan(catalog, models, ratios, lo), _plan(catalog, models, ratios, hi)  # type: ignore[arg-type]
        got = report[catalog] = compare(low, high)
        for c in got["changed"]:
            print(f"{catalog} {c['model']} I/O={c['io_ratio']:g}: {c['low']} -> {c['high']}")
        moves = ", ".join(
            f"{m} median {v['median']:+.1%} max |{v['max_abs']:.1%}|"
            for m, v in got["x_nd_change"].items()
            if v["median"] is not None
        )
        print(f"{catalog}: {len(got['changed'])} of {got['total']} winning modes change; x ND change {moves}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()

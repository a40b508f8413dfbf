"""Cost of one ``cost.stages.stage_work`` (+ ``stage_time_s``) call, the planner's inner loop.

For each of the paper's eight models: microseconds per DA / DF ``stage_work`` call with a repeated
context (memo hit) and with a fresh context every call (attention FLOPs recomputed), and one ideal
``stage_time_s``. The baseline, measured in the same run, is one ``RooflineCostModel.
decode_layer_times_s`` call for 64 equal contexts (what the simulator pays per decode step), so the
printout is a ratio, never a timed assertion.

    .venv/bin/python benchmarks/stage_work_speed.py [--calls 20000] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

from dualpath.cost import make_cost_model
from dualpath.cost.stages import stage_time_s, stage_work
from dualpath.planner.catalog import npu_catalog
from dualpath.planner.report import PAPER_MODELS as MODELS
from dualpath.spec.hardware import get_gpu
from dualpath.spec.models import get_model


def _per_call_us(fn, calls: int) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    n = args.calls
    device = npu_catalog()[0].device
    roofline = make_cost_model("roofline", get_gpu("h100"))
    rows = []
    for name in MODELS:
        model = get_model(name)
        contexts = [100_000] * 64
        base = _per_call_us(lambda i: roofline.decode_layer_times_s(model, contexts), max(1, n // 20))
        hit = _per_call_us(lambda i: stage_work(model, "da", batch=64, context_len=100_000), n)
        fresh = _per_call_us(lambda i: stage_work(model, "da", batch=64, context_len=50_000 + i), n)
        ffn = _per_call_us(lambda i: stage_work(model, "df", batch=1 + i % 512, context_len=100_000), n)
        work = stage_work(model, "da", batch=64, context_len=100_000)
        timed = _per_call_us(lambda i: stage_time_s(work, device), n)
        rows.append(
            {
                "model": name,
                "baseline_us": base,
                "da_hit_us": hit,
                "da_fresh_us": fresh,
                "df_us": ffn,
                "stage_time_us": timed,
                "fresh_over_baseline": fresh / base,
                "hit_over_baseline": hit / base,
            }
        )
    if args.json:
        print(json.dumps({"calls": n, "rows": rows}, indent=2))
        return
    print(f"{'model':<20}{'base us':>9}{'DA hit':>9}{'DA fresh':>10}{'DF':>8}{'time':>8}{'fresh/base':>12}")
    for r in rows:
        print(
            f"{r['model']:<20}{r['baseline_us']:9.1f}{r['da_hit_us']:9.1f}{r['da_fresh_us']:10.1f}"
            f"{r['df_us']:8.1f}{r['stage_time_us']:8.2f}{r['fresh_over_baseline']:12.3f}"
        )


if __name__ == "__main__":
    main()

"""The one fitted constant, ``budget_scale`` (issue 11, section 11), and what it is fitted to.

Target: the paper's NPU model-mean PDAF x ND curve (its Fig. 5) and nothing else: 0.48x at I/O = 1,
2.10x at 10, a plateau of 1.5-1.8x over 50-500, and 1.27x at 1000. The loss is the sum of squared
log errors at the three point targets plus, at each plateau ratio, the squared log distance to the
1.5-1.8 band (0 inside it). A ratio whose mean is missing (no PDAF allocation fits for any model)
costs as much as a 10x miss. :func:`scan` evaluates a list of scales with one shared plan memo and
returns every point, so the 0.5x and 2x neighbours of the best scale come from the same run when
the scales form a geometric grid (``benchmarks/planner_budget_fit.py`` uses factor sqrt 2).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dualpath.planner.report import PAPER_MODELS, PlanCache, ratio_key, sweep

POINT_TARGETS: dict[float, float] = {1.0: 0.48, 10.0: 2.10, 1000.0: 1.27}
PLATEAU_BAND = (1.5, 1.8)
PLATEAU_RATIOS = (50.0, 100.0, 200.0, 500.0)
FIT_RATIOS = (1.0, 10.0, 50.0, 100.0, 200.0, 500.0, 1000.0)
MISSING_LOG_ERROR = math.log(10.0)


def fig5_loss(pdaf_means: Mapping[str, float | None]) -> float:
    """Loss of a model-mean PDAF x ND curve (keys: ratio_key) against the paper's Fig. 5."""
    loss = 0.0
    for ratio, target in POINT_TARGETS.items():
        if ratio_key(ratio) in pdaf_means:
            value = pdaf_means[ratio_key(ratio)]
            err = MISSING_LOG_ERROR if not value else math.log(value / target)
            loss += err * err
    lo, hi = PLATEAU_BAND
    for ratio in PLATEAU_RATIOS:
        if ratio_key(ratio) in pdaf_means:
            value = pdaf_means[ratio_key(ratio)]
            if not value:
                err = MISSING_LOG_ERROR
            else:
                err = math.log(value / lo) if value < lo else max(0.0, math.log(value / hi))
            loss += err * err
    return loss


def scan(
    scales: Sequence[float],
    *,
    models: Sequence[str] = PAPER_MODELS,
    ratios: Sequence[float] = FIT_RATIOS,
    cache: PlanCache | None = None,
    progress: Callable[[str], None] | None = None,
    **config: Any,
) -> list[dict]:
    """One NPU sweep per scale; ``config`` sets other PlanConfig fields (e.g. ``top_k``)."""
    from dualpath.planner.config import PlanConfig

    cache = cache or PlanCache()
    points = []
    for scale in scales:
        base = PlanConfig(model=models[0], catalog="npu", io_ratio=ratios[0], budget_scale=scale, **config)
        res = sweep(base, models, ratios, cache=cache, progress=progress)
        means = res["model_mean_x_nd"].get("pdaf", {})
        points.append(
            {
                "budget_scale": scale,
                "loss": fig5_loss(means),
                "pdaf_mean": means,
                "pd_mean": res["model_mean_x_nd"].get("pd", {}),
                "af_mean": res["model_mean_x_nd"].get("af", {}),
                "counts": res["counts"],
                "rows": res["rows"],
            }
        )
    return points


def best_point(points: Sequence[Mapping]) -> Mapping:
    """The scanned scale with the lowest loss (ties: the smaller scale)."""
    return min(points, key=lambda p: (p["loss"], p["budget_scale"]))

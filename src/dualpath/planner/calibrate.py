"""The one fitted constant, ``budget_scale`` (docs/planner.md, "Calibration: `budget_scale`"), and what it is fitted to.

**Admissible scales**: a scale takes part in the fit only if ND cannot keep up (sigma < 1) at I/O
10 for every model: the paper compares at "the same power budget and request rate", which only
means something where ND cannot keep up. ND reaches sigma = 1 at I/O 10 at the demand anchor's
cost ``D_m`` (budget_demand.demand_anchor, the cheapest ND deployment doing so), and the weight
anchor buys ``scale x W_m``, so the admissible scales are those below ``min_m D_m / W_m``
(:func:`admissible_limit`; a model whose ND never reaches 1 sets no limit).

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
                "regime": res["regime"],
                "rows": res["rows"],
            }
        )
    return points


def admissible_limits(
    models: Sequence[str] = PAPER_MODELS, *, catalog: str = "npu", ref_io: float = 10.0, **config: Any
) -> dict[str, dict]:
    """Per model: the weight anchor W (cheapest ND holding the weights), the demand anchor D at
    ``ref_io`` and ``D / W``, the weight-anchored scale at which ND starts keeping up there (None:
    ND never reaches sigma = 1)."""
    from dualpath.cost.efficiency import get_efficiency
    from dualpath.planner.api import _anchor, demand_of, requests_of
    from dualpath.planner.budget import budget_kind, cheapest_nd
    from dualpath.planner.catalog import catalog as load_catalog
    from dualpath.planner.config import PlanConfig
    from dualpath.spec.models import get_model

    out = {}
    for name in models:
        cfg = PlanConfig(model=name, catalog=catalog, io_ratio=ref_io, **config)  # type: ignore[arg-type]
        devices = load_catalog(cfg.catalog, cfg.prices)
        base = get_model(name)
        w, w_desc = cheapest_nd(base, devices, budget_kind(catalog))
        demand = demand_of(requests_of(cfg, ref_io), cfg.rate_rps)
        d = _anchor(cfg, base, devices, demand, get_efficiency(cfg.efficiency))
        out[name] = {
            "weight_anchor": w,
            "weight_reference": w_desc,
            "demand_anchor": d.cost,
            "demand_reference": d.reference,
            "reached": d.reached,
            "limit_scale": d.cost / w if d.reached else None,
        }
    return out


def admissible_limit(limits: Mapping[str, Mapping]) -> float:
    """The largest admissible weight-anchored scale: below every model's D / W."""
    vals = [v["limit_scale"] for v in limits.values() if v["limit_scale"] is not None]
    return min(vals) if vals else math.inf


def best_point(points: Sequence[Mapping]) -> Mapping:
    """The scanned scale with the lowest loss among the admissible ones (those marked
    ``admissible`` False take no part; ties: the smaller scale)."""
    ok = [p for p in points if p.get("admissible", True)]
    return min(ok or points, key=lambda p: (p["loss"], p["budget_scale"]))

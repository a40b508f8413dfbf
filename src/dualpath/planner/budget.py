"""Budgets: an explicit power (W) or price (USD/hour) cap, or a default derived from the model.

Default (docs/planner.md, "Calibration: `budget_scale`"): ``budget = budget_scale x`` the cost of the cheapest ND deployment
that holds the model's 16-bit weights: the fewest replicas of ``t x p`` devices of one catalogue
type (t in ``parallel.TP_DEGREES``, p in ``parallel.PP_DEGREES``; MoE experts spread over all ``t p
d`` devices, ``parallel.min_replicas``) whose devices each hold their share. It is computed on the
**unmodified** model at 16 bits, so one model keeps one budget across I/O ratios, modes, precisions
and ablation points (the paper keeps its power budget fixed across its ablations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from dualpath.core.errors import ConfigError, require
from dualpath.planner.parallel import PP_DEGREES, TP_DEGREES, min_replicas

if TYPE_CHECKING:
    from dualpath.planner.catalog import CatalogDevice
    from dualpath.spec.models import ModelSpec

BUDGET_SCALE: Final = 90.51
"""Budget = BUDGET_SCALE x the cheapest ND deployment that holds the 16-bit weights.

The one constant the planner may fit (docs/planner.md, "Calibration"), fitted after the prefill
A/F rule (``--af-prefill``) and the partner-batch sigma were in, to the paper's NPU model-mean
PDAF/ND curve only (Fig. 5: 0.48x at I/O 1, 2.10x at 10, plateau 1.5-1.8x, 1.27x at 1000; loss in
``planner/calibrate.py``), over **admissible** scales only: those at which ND cannot keep up
(sigma < 1) at I/O 10 for every model, i.e. below min_m D_m / W_m = 93.5 (DS-V4-Flash; the demand
anchor over the weight anchor, ``calibrate.admissible_limits``). ``benchmarks/planner_budget_fit.py``
over 11.31 ... 90.51 (factor sqrt 2), 8 models x I/O 1, 10, 50, 100, 200, 500, 1000, 500 requests,
short list 16, top-K 64: 90.51 has the lowest loss, 1.159 (64: 1.402, 45.25: 1.556, 22.63: 1.912;
the earlier default 4,096 has 12.66 under the earlier rules). The loss still falls at the admissibility limit,
so the limit, not the loss, sets the scale. Every other result follows without refitting.
``PlanConfig.budget_scale`` overrides it; docs/planner.md ("Calibration") gives the scan."""

ALL_16: Final = {"pa": 16, "pf": 16, "da": 16, "df": 16}


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    kind: str  # "power_w" | "usd_per_hr"
    value: float
    scale: float | None  # None when set explicitly
    reference_cost: float | None  # the anchor deployment's cost (default budgets)
    reference: str | None  # "<device> x t x p x d"
    anchor: str | None = None  # "weight" | "demand" (None: explicit)
    reference_io: float | None = None  # demand anchor: the I/O ratio it was read at
    anchor_sigma: float | None = None  # demand anchor: the anchor deployment's sigma (1 if reached)

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "value": self.value,
            "scale": self.scale,
            "anchor": self.anchor,
            "reference_cost": self.reference_cost,
            "reference": self.reference,
            "reference_io": self.reference_io,
            "anchor_sigma": self.anchor_sigma,
        }


def budget_kind(catalog_name: str) -> str:
    """NPUs are budgeted by power, GPUs by price."""
    return "power_w" if catalog_name == "npu" else "usd_per_hr"


def cheapest_nd(model: ModelSpec, devices: tuple[CatalogDevice, ...], kind: str) -> tuple[float, str]:
    """(cost, description) of the cheapest ND deployment holding the 16-bit weights."""
    best: tuple[float, str] | None = None
    for dev in devices:
        unit = dev.cost(kind)  # type: ignore[arg-type]
        for tp in TP_DEGREES:
            for pp in PP_DEGREES:
                dp = min_replicas(model, ALL_16, tp, pp, dev.device.capacity_bytes)
                if dp is None:
                    continue
                cost = tp * pp * dp * unit
                desc = f"{dev.name} x tp{tp} x pp{pp} x dp{dp}"
                if best is None or (cost, desc) < best:
                    best = (cost, desc)
    if best is None:
        raise ConfigError(
            "model",
            model.name,
            "no catalogue deployment of up to "
            f"{max(TP_DEGREES) * max(PP_DEGREES)} devices holds its 16-bit weights",
        )
    return best


def resolve_budget(
    model: ModelSpec,
    devices: tuple[CatalogDevice, ...],
    catalog_name: str,
    *,
    budget_w: float | None,
    budget_usd_hr: float | None,
    budget_scale: float,
    demand: tuple[float, str, float | None, float] | None = None,
) -> Budget:
    """The run's budget: explicit (``budget_w`` for NPUs, ``budget_usd_hr`` for GPUs) or
    ``budget_scale x`` an anchor: ``cheapest_nd`` (weight), or ``demand`` = (cost, description,
    reference I/O, sigma) of budget_demand.demand_anchor. ``model`` must be the unmodified model."""
    kind = budget_kind(catalog_name)
    if budget_w is not None and budget_usd_hr is not None:
        raise ConfigError("budget", (budget_w, budget_usd_hr), "give --budget-w or --budget-usd-hr")
    explicit = budget_w if kind == "power_w" else budget_usd_hr
    wrong = budget_usd_hr if kind == "power_w" else budget_w
    if wrong is not None:
        key = "budget_usd_hr" if kind == "power_w" else "budget_w"
        raise ConfigError(key, wrong, f"the {catalog_name} catalogue is budgeted in {kind}")
    if explicit is not None:
        require(explicit > 0, "budget", explicit, "must be > 0")
        return Budget(kind=kind, value=float(explicit), scale=None, reference_cost=None, reference=None)
    require(budget_scale > 0, "budget_scale", budget_scale, "must be > 0")
    if demand is not None:
        cost, desc, ref_io, sigma = demand
        return Budget(
            kind=kind,
            value=budget_scale * cost,
            scale=budget_scale,
            reference_cost=cost,
            reference=desc,
            anchor="demand",
            reference_io=ref_io,
            anchor_sigma=sigma,
        )
    cost, desc = cheapest_nd(model, devices, kind)
    return Budget(
        kind=kind,
        value=budget_scale * cost,
        scale=budget_scale,
        reference_cost=cost,
        reference=desc,
        anchor="weight",
    )

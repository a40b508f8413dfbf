"""The demand-anchored default budget (``--budget-anchor demand``).

``budget = scale x`` the cost of the cheapest ND deployment whose capacity score reaches sigma = 1
on the request list of a reference I/O ratio (``--budget-ref-io``, default 10; ``plan``: the plan's
own ratio, so the budget follows the ratio), under the plan's sigma rule, 16-bit everywhere, no
budget pruning. At ``scale < 1`` ND cannot keep up at the reference ratio for every model alike,
the regime in which the paper's "same power budget and request rate" comparison means something.
Under ``partner-batch`` a finite run's decode score saturates (``C`` sequences at one per lane), so
ND may never reach 1: the anchor is then the cheapest deployment reaching the highest score any ND
candidate reaches (``reached`` False). The weight anchor (budget.py) stays the default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from dualpath.planner.budget import cheapest_nd
from dualpath.planner.modes import mode_spec
from dualpath.planner.search import Counts
from dualpath.planner.search_shortlist import candidates
from dualpath.planner.sigma_partner import smallest_dp

if TYPE_CHECKING:
    from dualpath.cost.efficiency import Efficiency
    from dualpath.planner.catalog import CatalogDevice
    from dualpath.planner.search import Candidate, Demand
    from dualpath.spec.models import ModelSpec

BUDGET_ANCHORS: Final = ("weight", "demand")
DEMAND_BUDGET_SCALE: Final = 0.5  # ND gets half the cost of keeping up at the reference ratio
DEMAND_REF_IO: Final = 10.0  # the ratio of the admissibility rule and of the paper's 2.10x peak
ALL16: Final = {s: (16,) for s in ("pa", "pf", "da", "df")}
ANCHOR_SEARCH_SCALE: Final = 2.0**24  # candidates up to this multiple of the weight anchor


@dataclass(frozen=True, slots=True, kw_only=True)
class DemandAnchor:
    cost: float  # of the anchor deployment
    reference: str  # "<device> x tp x pp x dp"
    sigma: float  # the anchor deployment's score (1 when reached)
    reached: bool  # some ND deployment reaches sigma = 1


def demand_anchor(
    model: ModelSpec,
    devices: Sequence[CatalogDevice],
    kind: str,
    demand: Demand,
    *,
    efficiency: Efficiency,
    prefill_token_budget: int,
    max_decode_batch: int,
    sigma_rule: str,
) -> DemandAnchor:
    """The cheapest ND deployment reaching sigma = 1 on ``demand`` (else the highest sigma)."""
    weight_cost, _ = cheapest_nd(model, tuple(devices), kind)
    kept = candidates(
        model,
        mode_spec("nd").pools[0],
        devices,
        demand,
        ALL16,
        budget=ANCHOR_SEARCH_SCALE * weight_cost,  # no pruning in practice; bounds the KV search
        budget_kind=kind,
        efficiency=efficiency,
        prefill_token_budget=prefill_token_budget,
        max_decode_batch=max_decode_batch,
        counts=Counts(),
        sigma_rule=sigma_rule,
    )
    dmax = 64 * max(1, demand.num_requests)  # past C lanes a finite run's decode score is flat
    reach = [(d * c.replica_cost, c.order, c, d) for c in kept if (d := smallest_dp(c, c.min_dp, dmax, 1.0))]
    if reach:
        cost, _, c, d = min(reach, key=lambda r: (r[0], r[1]))
        return DemandAnchor(cost=cost, reference=_desc(c, d), sigma=c.sigma_at(d), reached=True)
    best: tuple[float, float, int, Candidate, int] | None = None
    for c in kept:
        top = c.sigma_at(dmax)
        d = smallest_dp(c, c.min_dp, dmax, top * (1 - 1e-9)) or dmax
        key = (-float(f"{top:.9g}"), d * c.replica_cost, c.order, c, d)
        if best is None or key[:3] < best[:3]:
            best = key
    if best is None:
        from dualpath.core.errors import ConfigError

        raise ConfigError("model", model.name, "no catalogue ND deployment holds its 16-bit weights")
    _, cost, _, c, d = best
    return DemandAnchor(cost=cost, reference=_desc(c, d), sigma=c.sigma_at(d), reached=False)


def _desc(c: Candidate, d: int) -> str:
    return f"{c.device.name} x tp{c.tp} x pp{c.pp} x dp{d}"

"""Phase 1 of the search (docs/planner.md, "The model": the two-phase search): the short list of each pool.

**Phase 1** (per pool, analytic): every candidate (device, t, p, precision of the pool's stages)
gets ``sigma1 = tput / demand`` for one replica (demand ``lambda x I`` tokens/s for prefill,
``lambda x O`` for decode), from the same lane times the run uses. Prefill is read at one lane's
batch (the prompts that fit the token budget; a split PF side: each of its lanes takes one A lane's
tokens, the matched partner). Decode, under ``largest-batch``, at the largest batch a replica holds
(``max_decode_batch``, or fewer when its KV capacity holds fewer) with ``sigma = d x sigma1``;
under ``partner-batch`` (default) the pool's score is sigma_partner.Rater's (``min(C, d b_hold)``
sequences over its ``p d`` lanes). A merged pool adds its stages' times; its sigma is the smaller
of its phases'. A candidate needs ``min_dp`` replicas to hold its weights (MoE experts spread over
all ``t p d`` devices, parallel.min_replicas; doubled while a replica hosting decode attention
cannot hold the longest request's KV) and is scored at that size; candidates whose ``min_dp``
replicas exceed the budget, or whose non-expert share alone does not fit, are pruned. The short
list keeps the ``shortlist`` best (device, precision) groups by sigma per unit cost, plus the
group of the cheapest replica.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from dualpath.core.errors import require
from dualpath.planner import sigma_partner
from dualpath.planner.parallel import PP_DEGREES, TP_DEGREES, Layout, default_ep, min_replicas
from dualpath.planner.pools import PoolPlan, PoolTimer
from dualpath.planner.search import Candidate, Counts, Demand, replica_sigma
from dualpath.planner.sigma_partner import SIGMA_DEFAULT, SIGMA_RULES

if TYPE_CHECKING:
    from dualpath.cost.efficiency import Efficiency
    from dualpath.planner.catalog import CatalogDevice
    from dualpath.planner.modes import PoolSpec
    from dualpath.spec.models import ModelSpec


def bits_options(pool: PoolSpec, allowed: Mapping[str, Sequence[int]]) -> list[tuple[tuple[str, int], ...]]:
    """Every precision assignment of the pool's stages within ``allowed`` (stage -> bits)."""
    choices = [sorted(set(allowed[s]), reverse=True) for s in pool.stages]
    return [tuple(zip(pool.stages, combo, strict=True)) for combo in itertools.product(*choices)]


def phase1(
    model: ModelSpec,
    pool: PoolSpec,
    devices: Sequence[CatalogDevice],
    demand: Demand,
    allowed: Mapping[str, Sequence[int]],
    *,
    budget: float,
    budget_kind: str,
    efficiency: Efficiency,
    prefill_token_budget: int,
    max_decode_batch: int,
    shortlist: int,
    counts: Counts,
    sigma_rule: str = SIGMA_DEFAULT,
) -> list[list[Candidate]]:
    """The short list of one pool: the ``shortlist`` best (device, precision) groups by their
    best sigma1 per unit cost, each with all its surviving (t, p) layouts (``sigma_rule``
    ``partner-batch``: scores and ranking of sigma_partner.py)."""
    kept = candidates(
        model,
        pool,
        devices,
        demand,
        allowed,
        budget=budget,
        budget_kind=budget_kind,
        efficiency=efficiency,
        prefill_token_budget=prefill_token_budget,
        max_decode_batch=max_decode_batch,
        counts=counts,
        sigma_rule=sigma_rule,
    )
    if sigma_rule == "partner-batch":
        return shortlist_of(kept, shortlist, key=lambda c: sigma_partner.rank_key(c, budget))
    return shortlist_of(kept, shortlist)


_MEMO_SIZE = 48  # phase-1 candidate lists kept per process (plans differing only in later rules)
_MEMO: OrderedDict[tuple, tuple[list[Candidate], tuple[int, int, int]]] = OrderedDict()


def candidates(
    model: ModelSpec,
    pool: PoolSpec,
    devices: Sequence[CatalogDevice],
    demand: Demand,
    allowed: Mapping[str, Sequence[int]],
    *,
    budget: float,
    budget_kind: str,
    efficiency: Efficiency,
    prefill_token_budget: int,
    max_decode_batch: int,
    counts: Counts,
    sigma_rule: str = SIGMA_DEFAULT,
) -> list[Candidate]:
    """Every surviving candidate replica of one pool, scored (phase 1 before the short list).
    Memoised per process on every input (plans that differ only in phase-2 or run rules, such as
    the A/F prefill rule, the ND schedule or K, share it); ``counts`` is updated either way."""
    require(sigma_rule in SIGMA_RULES, "sigma", sigma_rule, f"choices: {', '.join(SIGMA_RULES)}")
    key = (
        model,
        pool.stages,
        tuple(devices),
        demand,
        tuple(sorted((k, tuple(v)) for k, v in allowed.items())),
        budget,
        budget_kind,
        id(efficiency),
        prefill_token_budget,
        max_decode_batch,
        sigma_rule,
    )
    hit = _MEMO.get(key)
    if hit is None:
        kept, local = _score_pool(
            model,
            pool,
            devices,
            demand,
            allowed,
            budget=budget,
            budget_kind=budget_kind,
            efficiency=efficiency,
            prefill_token_budget=prefill_token_budget,
            max_decode_batch=max_decode_batch,
            sigma_rule=sigma_rule,
        )
        hit = _MEMO[key] = (kept, (local.candidates, local.pruned_budget, local.pruned_residency))
        if len(_MEMO) > _MEMO_SIZE:
            _MEMO.popitem(last=False)
    else:
        _MEMO.move_to_end(key)
    kept, (n, budget_pruned, residency_pruned) = hit
    counts.candidates += n
    counts.pruned_budget += budget_pruned
    counts.pruned_residency += residency_pruned
    return kept


def _score_pool(
    model: ModelSpec,
    pool: PoolSpec,
    devices: Sequence[CatalogDevice],
    demand: Demand,
    allowed: Mapping[str, Sequence[int]],
    *,
    budget: float,
    budget_kind: str,
    efficiency: Efficiency,
    prefill_token_budget: int,
    max_decode_batch: int,
    sigma_rule: str,
) -> tuple[list[Candidate], Counts]:
    """Every layout of one pool scored, in enumeration order: the survivors and their counts."""
    local = Counts()
    kept = [
        c
        for order, (dev, bits, tp, pp) in enumerate(_layouts(pool, devices, allowed), start=1)
        if (
            c := _candidate(
                model,
                pool,
                dev,
                bits,
                tp,
                pp,
                order,
                demand,
                budget=budget,
                budget_kind=budget_kind,
                efficiency=efficiency,
                prefill_token_budget=prefill_token_budget,
                max_decode_batch=max_decode_batch,
                counts=local,
                sigma_rule=sigma_rule,
            )
        )
        is not None
    ]
    return kept, local


def _layouts(
    pool: PoolSpec, devices: Sequence[CatalogDevice], allowed: Mapping[str, Sequence[int]]
) -> Iterator[tuple[CatalogDevice, tuple[tuple[str, int], ...], int, int]]:
    """Every (device, precision, t, p) of a pool, in enumeration order."""
    for dev in devices:
        for bits in bits_options(pool, allowed):
            for tp in TP_DEGREES:
                for pp in PP_DEGREES:
                    yield dev, bits, tp, pp


def _candidate(
    model: ModelSpec,
    pool: PoolSpec,
    dev: CatalogDevice,
    bits: tuple[tuple[str, int], ...],
    tp: int,
    pp: int,
    order: int,
    demand: Demand,
    *,
    budget: float,
    budget_kind: str,
    efficiency: Efficiency,
    prefill_token_budget: int,
    max_decode_batch: int,
    counts: Counts,
    sigma_rule: str,
) -> Candidate | None:
    """One (device, precision, t, p) scored at its fewest replicas, or None (pruned, counted)."""
    counts.candidates += 1
    cost = tp * pp * dev.cost(budget_kind)  # type: ignore[arg-type]
    dmin = min_replicas(model, dict(bits), tp, pp, dev.device.capacity_bytes) if cost <= budget else None
    if cost > budget or dmin is None:
        counts.pruned_budget += int(cost > budget)
        counts.pruned_residency += int(cost <= budget)
        return None
    fit = _fit_replicas(
        model,
        pool,
        dev,
        bits,
        tp,
        pp,
        dmin,
        cost,
        demand,
        budget=budget,
        efficiency=efficiency,
        prefill_token_budget=prefill_token_budget,
        max_decode_batch=max_decode_batch,
        sigma_rule=sigma_rule,
    )
    dmin, sigmas, plan, timer = fit
    if dmin * cost > budget or sigmas is None:
        counts.pruned_budget += int(dmin * cost > budget)
        counts.pruned_residency += int(dmin * cost <= budget)
        return None
    rater = None
    if sigma_rule == "partner-batch":
        rater, sigmas = _partner_rater(
            model, plan, demand, efficiency, sigmas, dmin, max_decode_batch, prefill_token_budget, timer
        )
    return Candidate(
        device=dev,
        tp=tp,
        pp=pp,
        ep=default_ep(model, pool.stages, tp, pp),
        bits=bits,
        replica_cost=cost,
        sigma1=min(sigmas),
        sigma_sum=sum(sigmas),
        order=order,
        min_dp=dmin,
        rater=rater,
    )


def _fit_replicas(
    model: ModelSpec,
    pool: PoolSpec,
    dev: CatalogDevice,
    bits: tuple[tuple[str, int], ...],
    tp: int,
    pp: int,
    dmin: int,
    cost: float,
    demand: Demand,
    *,
    budget: float,
    efficiency: Efficiency,
    prefill_token_budget: int,
    max_decode_batch: int,
    sigma_rule: str,
) -> tuple[int, list[float] | None, PoolPlan | None, PoolTimer | None]:
    """The fewest replicas (doubling from ``dmin`` while EP leaves no room for KV) and their
    per-stage sigmas (None: none fits the budget), with the plan and timer they were scored on."""
    sigmas = plan = timer = None
    while dmin * cost <= budget:
        ep = default_ep(model, pool.stages, tp, pp, dmin)
        layout = Layout(tp=tp, pp=pp, dp=dmin, ep=ep)
        plan = PoolPlan(name=pool.name, stages=pool.stages, device=dev, layout=layout, bits=bits)
        timer = PoolTimer(model, plan, efficiency)
        sigmas = replica_sigma(
            model,
            plan,
            demand,
            efficiency=efficiency,
            prefill_token_budget=prefill_token_budget,
            max_decode_batch=max_decode_batch,
            timer=timer,
            decode=sigma_rule != "partner-batch",
        )
        if sigmas is not None or ep == 1:
            break
        dmin *= 2  # more replicas spread the experts thinner: room for KV
    return dmin, sigmas, plan, timer


def _partner_rater(
    model: ModelSpec,
    plan: PoolPlan,
    demand: Demand,
    efficiency: Efficiency,
    sigmas: list[float],
    dmin: int,
    max_decode_batch: int,
    prefill_token_budget: int,
    timer: PoolTimer,
) -> tuple[sigma_partner.Rater, list[float]]:
    """The partner-batch rater, and the sigmas with the decode phase's score per replica at the
    fewest replicas appended when the rater holds a decode phase."""
    rater = sigma_partner.make_rater(
        model,
        plan,
        demand,
        efficiency,
        sigmas,
        max_decode_batch=max_decode_batch,
        prefill_token_budget=prefill_token_budget,
        timer=timer,
    )
    if rater.hold:  # the decode phase's score per replica at the fewest replicas
        sigmas = [*sigmas, rater.decode_sigma(dmin) / dmin]
    return rater, sigmas


def _rank_key(c: Candidate) -> tuple[float, float, float, int]:
    return (
        -float(f"{c.sigma1 / c.replica_cost:.9g}"),
        c.replica_cost,
        -float(f"{c.sigma_sum / c.replica_cost:.9g}"),
        c.order,
    )


def shortlist_of(
    kept: Sequence[Candidate], size: int, key: Callable[[Candidate], tuple] | None = None
) -> list[list[Candidate]]:
    """Group by (device, precision), rank groups by their best sigma1 per unit cost (ties:
    cheaper, then the other phase, then enumeration order) and keep ``size`` groups, plus the group
    of the cheapest replica when it is not among them (the best sigma per cost is often a large
    replica that a small budget slice cannot buy, which would leave the slice empty). A group keeps
    every (t, p): phase 2 picks the layout that suits its budget slice (the most efficient layout
    is often the largest replica, which a small slice cannot buy)."""
    keys = {id(c): (key or _rank_key)(c) for c in kept}  # each key once (a bisection under partner-batch)

    def rank(c: Candidate) -> tuple:
        return keys[id(c)]

    groups: dict[tuple[str, tuple[tuple[str, int], ...]], list[Candidate]] = {}
    for c in sorted(kept, key=rank):
        groups.setdefault((c.device.name, c.bits), []).append(c)
    ordered = list(groups.values())
    out = ordered[:size]
    if ordered:  # and the group of the cheapest replica, so that a small slice can still buy one
        cheapest = min(kept, key=lambda c: (c.replica_cost, rank(c)))
        if not any(cheapest in g for g in out):
            out.append(next(g for g in ordered if cheapest in g))
    return out

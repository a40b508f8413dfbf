"""Phase 1 of the search (issue 11 section 6): the short list of each pool.

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

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from dualpath.core.errors import require
from dualpath.cost.stages import hidden_act_bytes_per_token
from dualpath.planner import sigma_partner
from dualpath.planner.parallel import PP_DEGREES, TP_DEGREES, Layout, default_ep, min_replicas
from dualpath.planner.pools import PoolPlan, PoolTimer
from dualpath.planner.search import (
    Candidate,
    Counts,
    Demand,
    decode_hold,
    prefill_lane_tokens,
    replica_sigma,
)
from dualpath.planner.sigma_partner import SIGMA_DEFAULT, SIGMA_RULES, Rater

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
    """Every surviving candidate replica of one pool, scored (phase 1 before the short list)."""
    require(sigma_rule in SIGMA_RULES, "sigma", sigma_rule, f"choices: {', '.join(SIGMA_RULES)}")
    kept: list[Candidate] = []
    order = 0
    for dev in devices:
        unit = dev.cost(budget_kind)  # type: ignore[arg-type]
        cap = dev.device.capacity_bytes
        for bits in bits_options(pool, allowed):
            for tp in TP_DEGREES:
                for pp in PP_DEGREES:
                    counts.candidates += 1
                    order += 1
                    cost = tp * pp * unit
                    if cost > budget:
                        counts.pruned_budget += 1
                        continue
                    dmin = min_replicas(model, dict(bits), tp, pp, cap)
                    if dmin is None:
                        counts.pruned_residency += 1
                        continue
                    sigmas = None
                    while dmin * cost <= budget:
                        ep = default_ep(model, pool.stages, tp, pp, dmin)
                        plan = PoolPlan(
                            name=pool.name,
                            stages=pool.stages,
                            device=dev,
                            layout=Layout(tp=tp, pp=pp, dp=dmin, ep=ep),
                            bits=bits,
                        )
                        sigmas = replica_sigma(
                            model,
                            plan,
                            demand,
                            efficiency=efficiency,
                            prefill_token_budget=prefill_token_budget,
                            max_decode_batch=max_decode_batch,
                        )
                        if sigmas is not None or ep == 1:
                            break
                        dmin *= 2  # more replicas spread the experts thinner: room for KV
                    if dmin * cost > budget:
                        counts.pruned_budget += 1
                        continue
                    if sigmas is None:
                        counts.pruned_residency += 1
                        continue
                    rater = None
                    if sigma_rule == "partner-batch":
                        rater = _rater(
                            model,
                            plan,
                            demand,
                            efficiency,
                            sigmas,
                            max_decode_batch=max_decode_batch,
                            prefill_token_budget=prefill_token_budget,
                        )
                    kept.append(
                        Candidate(
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
                    )
    return kept


def _rater(
    model: ModelSpec,
    plan: PoolPlan,
    demand: Demand,
    efficiency: Efficiency,
    sigmas: Sequence[float],
    *,
    max_decode_batch: int,
    prefill_token_budget: int,
) -> Rater:
    """The partner-batch rater of ``plan``'s candidate: its lane times at (batch, pool size); the
    pool size matters only where the experts are spread over the whole pool (e = t p d)."""
    lay = plan.layout
    stages = plan.stages
    pooled = default_ep(model, stages, lay.tp, lay.pp) > 1
    timers: dict[int, PoolTimer] = {}

    def timer_at(dp: int) -> PoolTimer:
        size = _pool_size_grid(dp) if pooled else lay.dp
        timer = timers.get(size)
        if timer is None:
            ep = default_ep(model, stages, lay.tp, lay.pp, size)
            sized = dataclasses.replace(plan, layout=Layout(tp=lay.tp, pp=lay.pp, dp=size, ep=ep))
            timer = timers[size] = PoolTimer(model, sized, efficiency)
        return timer

    ctx = demand.input_len + demand.output_len / 2
    dec = [s for s in stages if s in ("da", "df")]

    def dec_lane(batch: int, dp: int) -> float:
        t = timer_at(dp)
        return sum(t.timers[s].decode_s(batch, ctx) for s in dec)

    def pf_lane(tokens: int, dp: int) -> float:
        return timer_at(dp).timers["pf"].prefill_uniform_s(1, tokens)

    lane_tokens = prefill_lane_tokens(demand, prefill_token_budget)
    length = max(1, round(demand.input_len))
    pre_lane = 0.0
    if "pa" in stages and "pf" not in stages:  # the A side of a split prefill unit
        pre_lane = timer_at(lay.dp).timers["pa"].prefill_uniform_s(lane_tokens // length, length)
    hold = decode_hold(model, plan, demand, max_decode_batch) if dec else 0
    bits = plan.bits_map
    return Rater(
        lanes=lay.pp,
        devices=lay.tp * lay.pp,
        hold=hold or 0,
        concurrency=demand.num_requests,
        prefill_sigma1=sigmas[0] if any(s in ("pa", "pf") for s in stages) else math.inf,
        pre_lane_tokens=lane_tokens,
        pre_lane_s=pre_lane,
        demand_decode_tps=demand.decode_tokens_per_s,
        act_prefill=hidden_act_bytes_per_token(model, bits.get("pa", bits.get("pf", 16))),
        act_decode=hidden_act_bytes_per_token(model, bits.get("da", bits.get("df", 16))),
        dec_lane_fn=dec_lane if dec else None,
        pf_lane_fn=pf_lane if "pf" in stages else None,
        pooled=pooled,
    )


def _pool_size_grid(dp: int) -> int:
    """The pool size a pooled-expert rater reads its step at: ``dp`` up to 8, beyond it the
    nearest point of a grid 2^(1/4) apart (the experts' sharing changes slowly with the pool size;
    one timer per grid point keeps phase 1 and 2 fast). The run uses the exact size."""
    if dp <= 8:
        return dp
    return round(2 ** (round(4 * math.log2(dp)) / 4))


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
    rank = key or _rank_key
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

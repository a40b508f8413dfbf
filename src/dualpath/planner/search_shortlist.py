"""Phase 1 of the search (issue 11 section 6): the short list of each pool.

**Phase 1** (per pool, analytic): every candidate (device, t, p, precision of the pool's stages)
gets ``sigma1 = tput / demand`` for one replica; a pool of d replicas has ``sigma = d x sigma1``.
Demand is ``lambda x I`` tokens/s for prefill and ``lambda x O`` for decode; ``tput`` is one
replica's tokens/s at the largest batch it holds (prefill: the prompts that fit the token budget; a
split PF side: every token its free memory holds one layer's activations of, since it batches all A
lanes' tokens; decode: ``max_decode_batch`` or fewer when its KV capacity holds fewer), from the
same lane times the run uses. A merged pool adds its stages' times; its sigma is the smaller of its
phases'. A candidate needs ``min_dp`` replicas to hold its weights (MoE experts spread over all ``t
p d`` devices, parallel.min_replicas; doubled while a replica hosting decode attention cannot hold
the longest request's KV) and is scored at that size; candidates whose ``min_dp`` replicas exceed
the budget, or whose non-expert share alone does not fit, are pruned. The short list keeps the
``shortlist`` best (device, precision) groups by sigma1 per unit cost, plus the group of the
cheapest replica.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from dualpath.core.errors import require
from dualpath.cost.stages import kv_cache_bytes
from dualpath.planner import sigma_batch
from dualpath.planner.parallel import PP_DEGREES, TP_DEGREES, Layout, default_ep, min_replicas
from dualpath.planner.pools import PoolPlan, PoolTimer
from dualpath.planner.search import Candidate, Counts, Demand, decode_hold, decode_step_s, replica_sigma
from dualpath.planner.sigma_batch import SIGMA_RULES, DecodeCurve

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
    sigma_rule: str = "largest-batch",
) -> list[list[Candidate]]:
    """The short list of one pool: the ``shortlist`` best (device, precision) groups by their
    best sigma1 per unit cost, each with all its surviving (t, p) layouts (``sigma_rule``
    ``batch-aware``: scores and ranking of sigma_batch.py)."""
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
                    curve, pre_s = None, 0.0
                    if sigma_rule == "batch-aware":
                        if any(s in ("da", "df") for s in pool.stages):
                            curve = _curve(model, plan, demand, efficiency, sigmas, max_decode_batch)
                        if "pa" in pool.stages:
                            pre_s = _prefill_iter_s(model, plan, demand, efficiency, prefill_token_budget)
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
                            curve=curve,
                            decode_f="df" in pool.stages,
                            prefill_s=pre_s,
                        )
                    )
    if sigma_rule == "batch-aware":
        return shortlist_of(kept, shortlist, key=lambda c: sigma_batch.rank_key(c, budget))
    return shortlist_of(kept, shortlist)


def _curve(
    model: ModelSpec,
    plan: PoolPlan,
    demand: Demand,
    efficiency: Efficiency,
    sigmas: Sequence[float],
    max_decode_batch: int,
) -> DecodeCurve:
    """The batch-aware decode score of ``plan``'s candidate: step times at (batch, pool size);
    the pool size matters only where the experts are spread over the whole pool (e = t p d)."""
    hold = decode_hold(model, plan, demand, max_decode_batch)
    assert hold is not None  # replica_sigma accepted the plan
    lay = plan.layout
    pooled = default_ep(model, plan.stages, lay.tp, lay.pp) > 1
    timers: dict[int, PoolTimer] = {}

    def step_s(batch: int, dp: int) -> float:
        size = dp if pooled else lay.dp
        timer = timers.get(size)
        if timer is None:
            ep = default_ep(model, plan.stages, lay.tp, lay.pp, size)
            sized = dataclasses.replace(plan, layout=Layout(tp=lay.tp, pp=lay.pp, dp=size, ep=ep))
            timer = timers[size] = PoolTimer(model, sized, efficiency)
        return decode_step_s(timer, batch, demand)

    has_prefill = any(s in ("pa", "pf") for s in plan.stages)
    kv_req = (
        kv_cache_bytes(model, max(1, round(demand.input_len)), plan.bits_map["da"])
        if "da" in plan.stages
        else 0.0
    )
    return DecodeCurve(
        output_len=demand.output_len,
        kv_request_bytes=kv_req,
        hold=hold,
        concurrency=demand.num_requests,
        prefill_sigma1=sigmas[0] if has_prefill else math.inf,
        step_s=step_s,
        demand_tps=demand.decode_tokens_per_s,
        pooled=pooled,
    )


def _prefill_iter_s(
    model: ModelSpec, plan: PoolPlan, demand: Demand, efficiency: Efficiency, prefill_token_budget: int
) -> float:
    """One lane's prefill iteration of mean prompts (the prefill part of a request's residence)."""
    timer = PoolTimer(model, plan, efficiency)
    length = max(1, round(demand.input_len))
    k = max(1, prefill_token_budget // length)
    return sum(timer.timers[s].prefill_uniform_s(k, length) for s in plan.stages if s in ("pa", "pf"))


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

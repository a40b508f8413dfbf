"""The two-phase search (issue 11 section 6): analytic capacity scores, then budget splits.

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

**Phase 2**: every split of the budget over the mode's pools on a 1/``grid`` grid. In each slice a
pool takes the cheapest short-listed candidate reaching sigma >= 1 (else the highest-sigma one)
(never fewer than its ``min_dp`` replicas); the unspent budget then goes one replica at a time to
the lowest-sigma pool that still fits. ``sigma_joint = min`` over pools. Besides that rule's pick,
each split also yields the variants where one pool takes another of its short-listed candidates (so
a one-pool mode, ND, ranks its whole short list too). Allocations are ranked by sigma_joint (ties:
lower cost), duplicates dropped. Deterministic: every order has a total tie-break.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dualpath.core.errors import require
from dualpath.cost.stages import hidden_act_bytes_per_token, kv_cache_bytes
from dualpath.planner import sigma_batch
from dualpath.planner.links import N2N_GBS, n2n_bytes_per_s
from dualpath.planner.modes import ModeSpec, PoolSpec
from dualpath.planner.parallel import PP_DEGREES, TP_DEGREES, Layout, default_ep, min_replicas
from dualpath.planner.pools import Allocation, PoolPlan, PoolTimer
from dualpath.planner.sigma_batch import SIGMA_RULES, DecodeCurve

if TYPE_CHECKING:
    from dualpath.cost.efficiency import Efficiency
    from dualpath.planner.catalog import CatalogDevice
    from dualpath.spec.models import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Demand:
    """What the workload asks of the pools (means over the request list)."""

    rate_rps: float
    input_len: float
    output_len: float
    max_context_len: int  # the longest request's final context (residency check)
    num_requests: int = 500

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.rate_rps * self.input_len

    @property
    def decode_tokens_per_s(self) -> float:
        return self.rate_rps * self.output_len


@dataclass(slots=True)
class Counts:
    candidates: int = 0
    pruned_budget: int = 0
    pruned_residency: int = 0
    allocations_ranked: int = 0
    simulated: int = 0
    events: int = 0

    def to_json(self, top_k: int) -> dict[str, int]:
        return {
            "top_k": top_k,
            "candidates": self.candidates,
            "pruned_budget": self.pruned_budget,
            "pruned_residency": self.pruned_residency,
            "allocations_ranked": self.allocations_ranked,
            "simulated": self.simulated,
            "events": self.events,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One replica of a pool: device, t, p, e, precision; its cost and sigma1."""

    device: CatalogDevice
    tp: int
    pp: int
    ep: int  # one replica's (t p for MoE F pools); a pool of d replicas spreads experts over t p d
    bits: tuple[tuple[str, int], ...]
    replica_cost: float
    sigma1: float
    sigma_sum: float = 0.0  # sum of the phases' sigma1 (tie-break: the non-binding phase counts)
    min_dp: int = 1  # fewest replicas that hold the weights (experts spread over t p d devices)
    order: int = field(default=0)  # position in the enumeration (tie-break)
    curve: DecodeCurve | None = None  # set under --sigma batch-aware for pools with a decode stage
    decode_f: bool = False  # the pool runs decode FFN (batch-aware coupling to the KV pool)
    prefill_s: float = 0.0  # batch-aware: one prefill iteration on a lane (hosting PA), else 0

    def sigma_at(self, dp: int) -> float:
        """The pool's sigma with ``dp`` replicas: ``dp x sigma1`` (the issue's rule), or the
        batch-aware score when a curve is set (sigma_batch.py)."""
        return dp * self.sigma1 if self.curve is None else self.curve.sigma(dp)

    def plan(self, pool: PoolSpec, dp: int) -> PoolPlan:
        return PoolPlan(
            name=pool.name,
            stages=pool.stages,
            device=self.device,
            layout=Layout(tp=self.tp, pp=self.pp, dp=dp, ep=self.ep * dp if self.ep > 1 else 1),
            bits=self.bits,
            sigma=self.sigma_at(dp),
        )


def replica_sigma(
    model: ModelSpec,
    plan: PoolPlan,
    demand: Demand,
    *,
    efficiency: Efficiency,
    prefill_token_budget: int,
    max_decode_batch: int,
) -> list[float] | None:
    """sigma1 of each phase of one replica of ``plan`` (its dp is ignored; the pool's sigma1 is
    the min); None when it cannot hold one of the longest requests' KV (hosting decode
    attention)."""
    timer = PoolTimer(model, plan, efficiency)
    t, p = plan.layout.tp, plan.layout.pp
    stages = plan.stages
    sigmas: list[float] = []
    length = max(1, round(demand.input_len))
    if "pa" in stages:  # the lane's batch: the prompts that fit the token budget
        k = max(1, prefill_token_budget // length)
        time_s = sum(timer.timers[s].prefill_uniform_s(k, length) for s in stages if s in ("pa", "pf"))
        sigmas.append(p * k * length / time_s / demand.prefill_tokens_per_s)
    elif "pf" in stages:  # a split F side batches every A lane's tokens: as many as it holds
        free = max(plan.device.device.capacity_bytes - plan.weights_per_device(model), 0.0)
        per_token = 2.0 * hidden_act_bytes_per_token(model, plan.bits_map["pf"])
        tokens = int(min(free * t / per_token, demand.num_requests * length))
        if tokens < 1:
            return None
        time_s = timer.timers["pf"].prefill_uniform_s(1, tokens)
        sigmas.append(p * tokens / time_s / demand.prefill_tokens_per_s)
    if any(s in ("da", "df") for s in stages):
        batch = decode_hold(model, plan, demand, max_decode_batch)
        if batch is None:
            return None
        sigmas.append(batch / decode_step_s(timer, batch, demand) / demand.decode_tokens_per_s)
    return sigmas


def decode_hold(model: ModelSpec, plan: PoolPlan, demand: Demand, max_decode_batch: int) -> int | None:
    """The largest decode batch one replica holds: ``max_decode_batch``, or fewer when its KV
    capacity (hosting decode attention) holds fewer requests of the mean final context; None when
    it cannot hold one of the longest requests' KV."""
    batch = max_decode_batch
    if "da" in plan.stages:
        lay = plan.layout
        free = plan.device.device.capacity_bytes - plan.weights_per_device(model)
        cap = max(free, 0.0) * lay.tp * lay.pp
        bits = plan.bits_map["da"]
        if cap < kv_cache_bytes(model, demand.max_context_len, bits):
            return None
        mean_ctx = round(demand.input_len + demand.output_len)
        batch = min(batch, int(cap // kv_cache_bytes(model, mean_ctx, bits)))
    return batch


def decode_step_s(timer: PoolTimer, batch: int, demand: Demand) -> float:
    """One replica's decode step at ``batch`` sequences (spread over its p lanes), mean context."""
    lane = math.ceil(batch / timer.plan.layout.pp)
    ctx = demand.input_len + demand.output_len / 2
    return sum(timer.timers[s].decode_s(lane, ctx) for s in timer.plan.stages if s in ("da", "df"))


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


def _pick(cands: Sequence[Candidate], slice_budget: float) -> tuple[Candidate, int] | None:
    """The rule: cheapest candidate reaching sigma >= 1 within the slice, else the highest sigma."""
    best: tuple[tuple[float, float, int], Candidate, int] | None = None
    for c in cands:
        need = max(c.min_dp, math.ceil(1.0 / c.sigma1 - 1e-12))
        if need * c.replica_cost <= slice_budget * (1 + 1e-12):
            key = (need * c.replica_cost, -need * c.sigma_sum, c.order)
            if best is None or key < best[0]:
                best = (key, c, need)
    if best is not None:
        return best[1], best[2]
    fallback = None
    for c in cands:
        d = int(slice_budget * (1 + 1e-12) // c.replica_cost)
        key2 = (-float(f"{d * c.sigma1:.9g}"), -d * c.sigma_sum, c.order)
        if d >= c.min_dp and (fallback is None or key2 < fallback[0]):
            fallback = (key2, c, d)
    return None if fallback is None else (fallback[1], fallback[2])


def _fill(chosen: list[list[object]], leftover: float) -> None:
    """Hand ``leftover`` out one replica at a time to the lowest-sigma pool that fits (in bulk
    steps that give the same result). ``chosen`` rows are [candidate, dp], mutated.

    Each round gives the lowest-sigma pool (ties: the lower index) the replicas that lift it just
    past the next-lowest (or all it can buy when alone); the loop is written out on plain lists
    because budgets that buy thousands of replicas leapfrog two near-equal pools one replica a
    round (the floating-point operations are the reference rule's, in its order)."""
    n = len(chosen)
    unit = [r[0].replica_cost for r in chosen]  # type: ignore[attr-defined]
    rate = [r[0].sigma1 for r in chosen]  # type: ignore[attr-defined]
    dps: list[int] = [r[1] for r in chosen]  # type: ignore[misc]
    tol = 1 + 1e-12
    inf = math.inf
    while True:
        lim = leftover * tol
        best = -1
        low = second = inf
        for j in range(n):
            if unit[j] <= lim:
                sj = dps[j] * rate[j]
                if best < 0 or sj < low:
                    if best >= 0 and low < second:
                        second = low
                    best, low = j, sj
                elif sj < second:
                    second = sj
        if best < 0:
            break
        room = int(lim // unit[best])
        k = room if second == inf else min(room, int((second - low) / rate[best]) + 1)
        k = max(1, k)
        dps[best] += k
        leftover -= k * unit[best]
    for row, dp in zip(chosen, dps, strict=True):
        row[1] = dp


def _splits(num_pools: int, grid: int) -> list[tuple[int, ...]]:
    if num_pools == 1:
        return [(grid,)]
    return [s for s in itertools.product(range(1, grid), repeat=num_pools) if sum(s) == grid]


def phase2(
    mode: ModeSpec,
    shortlists: Mapping[str, Sequence[Sequence[Candidate]]],
    *,
    budget: float,
    grid: int,
    counts: Counts,
    sigma_rule: str = "largest-batch",
    n2n_gbs: float = N2N_GBS,
) -> list[Allocation]:
    """Ranked, de-duplicated allocations of ``mode`` (best first)."""
    batch_aware = sigma_rule == "batch-aware"
    pick = sigma_batch.pick if batch_aware else _pick
    fill = sigma_batch.fill if batch_aware else _fill
    pools = mode.pools
    seen: dict[tuple[object, ...], Allocation] = {}
    started: set[tuple[tuple[int, int], ...]] = set()  # many splits start alike
    for split in _splits(len(pools), grid):
        slices = [budget * k / grid for k in split]
        flat = [[c for g in shortlists[p.name] for c in g] for p in pools]
        base = [pick(f, s) for f, s in zip(flat, slices, strict=True)]
        if any(b is None for b in base):
            continue
        variants: list[list[tuple[Candidate, int]]] = [base]  # type: ignore[list-item]
        for i, (p, s) in enumerate(zip(pools, slices, strict=True)):
            for group in shortlists[p.name]:
                if base[i][0] in group:  # type: ignore[index]
                    continue
                other = pick(group, s)
                if other is not None:
                    variants.append([*base[:i], other, *base[i + 1 :]])  # type: ignore[list-item]
        for var in variants:
            chosen: list[list[object]] = [[c, d] for c, d in var]
            spent = sum(c.replica_cost * d for c, d in var)
            if spent > budget * (1 + 1e-9):
                continue
            start = tuple((id(c), d) for c, d in var)  # the fill is a function of its start,
            if start in started:  # so an allocation seen once is already ranked
                continue
            started.add(start)
            fill(chosen, budget - spent)
            plans = tuple(
                c.plan(p, d)  # type: ignore[attr-defined]
                for (c, d), p in zip(chosen, pools, strict=True)
            )
            if batch_aware:
                names = [p.name for p in pools]
                kvb = mode.kv_boundary
                coupled = sigma_batch.coupled_sigmas(
                    names.index(mode.kv_pool.name),
                    chosen,  # type: ignore[arg-type]
                    kv_boundary=None if kvb is None else (names.index(kvb[0]), names.index(kvb[1])),
                    n2n_bps=n2n_bytes_per_s(1, 1, n2n_gbs),
                )
                if coupled is not None:
                    plans = tuple(
                        dataclasses.replace(p, sigma=x) for p, x in zip(plans, coupled, strict=True)
                    )
            cost = sum(c.replica_cost * d for c, d in chosen)  # type: ignore[attr-defined,operator]
            alloc = Allocation(
                mode=mode.name, pools=plans, cost=cost, sigma_joint=min(p.sigma for p in plans)
            )
            key = alloc.key()
            if key not in seen:
                seen[key] = alloc
    ranked = sorted(seen.values(), key=lambda a: (-float(f"{a.sigma_joint:.9g}"), a.cost, repr(a.key())))
    counts.allocations_ranked += len(ranked)
    return ranked

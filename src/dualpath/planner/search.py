"""The two-phase search (docs/planner.md, "The model"): its vocabulary and the analytic per-replica score.

Phase 1 (search_shortlist.py) gives every candidate replica of a pool an analytic capacity score
and short-lists the best; phase 2 (search_allocate.py) splits the budget over a mode's pools and
ranks the allocations. Here: the workload's :class:`Demand`, the search :class:`Counts`, one
:class:`Candidate` replica, and its score (``replica_sigma``: ``sigma1 = tput / demand`` of each
phase, from the same lane times the run uses).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dualpath.cost.stages import hidden_act_bytes_per_token, kv_cache_bytes
from dualpath.planner.parallel import Layout
from dualpath.planner.pools import PoolPlan, PoolTimer

if TYPE_CHECKING:
    from dualpath.cost.efficiency import Efficiency
    from dualpath.planner.catalog import CatalogDevice
    from dualpath.planner.modes import PoolSpec
    from dualpath.planner.sigma_partner import Rater
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
    stopped: int = 0  # simulations stopped once they could no longer beat the mode's best
    skipped: int = 0  # allocations whose makespan lower bound already loses: not simulated
    events: int = 0

    def to_json(self, top_k: int) -> dict[str, int]:
        return {
            "top_k": top_k,
            "candidates": self.candidates,
            "pruned_budget": self.pruned_budget,
            "pruned_residency": self.pruned_residency,
            "allocations_ranked": self.allocations_ranked,
            "simulated": self.simulated,
            "stopped_early": self.stopped,
            "skipped_by_bound": self.skipped,
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
    rater: Rater | None = None  # set under --sigma partner-batch (sigma_partner.py)

    def sigma_at(self, dp: int) -> float:
        """The pool's standalone sigma with ``dp`` replicas: ``dp x sigma1`` (largest-batch), or
        the partner-batch score when a rater is set (sigma_partner.py)."""
        return dp * self.sigma1 if self.rater is None else self.rater.sigma(dp)

    def plan(self, pool: PoolSpec, dp: int) -> PoolPlan:
        return PoolPlan(
            name=pool.name,
            stages=pool.stages,
            device=self.device,
            layout=Layout(tp=self.tp, pp=self.pp, dp=dp, ep=self.ep * dp if self.ep > 1 else 1),
            bits=self.bits,
            sigma=self.sigma_at(dp),
        )


def prefill_lane_tokens(demand: Demand, prefill_token_budget: int) -> int:
    """Tokens one prefill lane takes per iteration: the mean prompts that fit the budget (one
    prompt when it is longer)."""
    length = max(1, round(demand.input_len))
    return max(1, prefill_token_budget // length) * length


def replica_sigma(
    model: ModelSpec,
    plan: PoolPlan,
    demand: Demand,
    *,
    efficiency: Efficiency,
    prefill_token_budget: int,
    max_decode_batch: int,
    timer: PoolTimer | None = None,
    decode: bool = True,
) -> list[float] | None:
    """sigma1 of each phase of one replica of ``plan`` (its dp is ignored; the pool's sigma1 is
    the min); None when it cannot hold one of the longest requests' KV (hosting decode
    attention). ``decode`` False: the residency check only, no decode score (partner-batch
    scores decode with its rater)."""
    timer = timer or PoolTimer(model, plan, efficiency)
    t, p = plan.layout.tp, plan.layout.pp
    stages = plan.stages
    sigmas: list[float] = []
    length = max(1, round(demand.input_len))
    k = max(1, prefill_token_budget // length)
    if "pa" in stages:  # the lane's batch: the prompts that fit the token budget
        time_s = sum(timer.timers[s].prefill_uniform_s(k, length) for s in stages if s in ("pa", "pf"))
        sigmas.append(p * k * length / time_s / demand.prefill_tokens_per_s)
    elif "pf" in stages:  # a split F side: each lane takes one A lane's tokens (the matched partner)
        free = max(plan.device.device.capacity_bytes - plan.weights_per_device(model), 0.0)
        per_token = 2.0 * hidden_act_bytes_per_token(model, plan.bits_map["pf"])
        tokens = int(min(free * t / per_token, k * length))  # one layer's activations must fit
        if tokens < 1:
            return None
        time_s = timer.timers["pf"].prefill_uniform_s(1, tokens)
        sigmas.append(p * tokens / time_s / demand.prefill_tokens_per_s)
    if any(s in ("da", "df") for s in stages):
        batch = decode_hold(model, plan, demand, max_decode_batch)
        if batch is None:
            return None
        if decode:
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


def pick_rule(
    cands: Sequence[Candidate],
    need_of: Callable[[Candidate], int | None],
    fallback_of: Callable[[Candidate], tuple[int, float] | None],
) -> tuple[Candidate, int] | None:
    """Phase 2's pick in one slice: the cheapest candidate whose ``need_of`` (replicas reaching
    sigma >= 1 within the slice, or None) exists, ties to the larger summed sigma, then the lower
    order; else the highest ``fallback_of`` score ((replicas, sigma) the slice buys, or None),
    compared at 9 significant digits, with the same ties."""
    best: tuple[tuple[float, float, int], Candidate, int] | None = None
    for c in cands:
        need = need_of(c)
        if need is not None:
            key = (need * c.replica_cost, -need * c.sigma_sum, c.order)
            if best is None or key < best[0]:
                best = (key, c, need)
    if best is not None:
        return best[1], best[2]
    fallback: tuple[tuple[float, float, int], Candidate, int] | None = None
    for c in cands:
        got = fallback_of(c)
        if got is None:
            continue
        d, score = got
        key2 = (-float(f"{score:.9g}"), -d * c.sigma_sum, c.order)
        if fallback is None or key2 < fallback[0]:
            fallback = (key2, c, d)
    return None if fallback is None else (fallback[1], fallback[2])

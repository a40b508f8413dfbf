"""``--sigma partner-batch`` (the default): a stage rated at the batch its partner gives it.

The paper's phase-1 score is ``sigma = d x throughput / demand`` (heteropanacea.md, "Search"); it
does not say at which batch the throughput is read. ``largest-batch`` (the planner issue's first
reading, kept for comparison) reads it at the largest batch a replica holds and scales linearly in
d. This rule reads it at the batch the finite run gives the stage:

- **decode**: a pool decodes ``S = min(C, d_kv x b_hold, slots)`` sequences at once (C: the run's
  requests in flight at most; ``b_hold``: mean-context requests one KV replica holds; slots:
  ``max_decode_batch`` per replica of the pools running decode), spread over its ``p d`` lanes;
- **split prefill**: the F side (PF) takes the tokens the A side's lanes hand over per iteration
  (``lanes_A x`` one lane's prompts, at most the token budget each), spread over its own lanes.

Here: the standalone score of one candidate (:class:`Rater`; no partner known yet: a decode pool
holds its own ``b_hold`` or, without KV, ``max_decode_batch`` per replica; a PF replica's lanes
each take one A lane's tokens), used by phase 1's short list and phase 2's pick. Phase 2 then
rates a whole allocation at its partners' batches (search_fill.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from dualpath.cost.stages import hidden_act_bytes_per_token
from dualpath.planner.parallel import Layout, default_ep
from dualpath.planner.pools import PoolPlan, PoolTimer
from dualpath.planner.search import decode_hold, pick_rule, prefill_lane_tokens

if TYPE_CHECKING:
    from dualpath.cost.efficiency import Efficiency
    from dualpath.planner.search import Candidate, Demand
    from dualpath.spec.models import ModelSpec

SIGMA_RULES: Final = ("partner-batch", "largest-batch")
SIGMA_DEFAULT: Final = "partner-batch"
TOL: Final = 1 + 1e-12


@dataclass(frozen=True, slots=True, kw_only=True)
class Rater:
    """One candidate replica's lane times and standalone score (partner-batch rule).

    ``dec_lane_s(b, d)``: the pool's decode stages' step on one lane at ``b`` sequences per lane in
    a pool of ``d`` replicas; ``pf_lane_s(n, d)``: a split F side's prefill of ``n`` tokens on one
    lane. ``d`` matters only where the experts are spread over the whole pool (``pooled``)."""

    lanes: int  # p: lanes per replica
    devices: int  # t p: devices per replica (N2N bandwidth)
    hold: int  # decode sequences one replica holds (0: no decode stage)
    concurrency: int  # C
    prefill_sigma1: float  # one replica's linear prefill score (inf: no prefill stage)
    pre_lane_tokens: int  # tokens one A lane takes per prefill iteration
    pre_lane_s: float  # A side of a split prefill unit: one lane's iteration (0: not that side)
    demand_decode_tps: float
    act_prefill: float  # hidden-state bytes per token at the pool's prefill / decode precision
    act_decode: float
    dec_lane_fn: Callable[[int, int], float] | None = None
    pf_lane_fn: Callable[[int, int], float] | None = None
    pooled: bool = False
    _memo: dict[tuple[str, int, int], float] = field(default_factory=dict, compare=False, repr=False)

    def _cached(self, kind: str, fn: Callable[[int, int], float] | None, n: int, dp: int) -> float:
        key = (kind, n, dp if self.pooled else 0)
        t = self._memo.get(key)
        if t is None:
            assert fn is not None, kind
            t = self._memo[key] = fn(n, dp)
        return t

    def dec_lane_s(self, batch_per_lane: int, dp: int) -> float:
        return self._cached("d", self.dec_lane_fn, batch_per_lane, dp)

    def pf_lane_s(self, tokens_per_lane: int, dp: int) -> float:
        return self._cached("p", self.pf_lane_fn, tokens_per_lane, dp)

    def decode_sigma(self, dp: int, held: int | None = None) -> float:
        """Standalone decode score of ``dp`` replicas: ``S / t(S over p d lanes) / demand`` with
        ``S = min(C, dp x hold)`` (``held`` overrides S)."""
        s = min(self.concurrency, dp * self.hold) if held is None else held
        t = self.dec_lane_s(math.ceil(s / (self.lanes * dp)), dp)
        return s / t / self.demand_decode_tps

    def sigma(self, dp: int) -> float:
        """The pool's standalone score with ``dp`` replicas (the smaller of its phases')."""
        if dp <= 0:
            return 0.0
        out = dp * self.prefill_sigma1
        if self.hold:
            out = min(out, self.decode_sigma(dp))
        return out


def smallest_dp(c: Candidate, lo: int, hi: int, target: float) -> int | None:
    """Smallest d in [lo, hi] with ``c.sigma_at(d) >= target`` (scores non-decreasing in d)."""
    if hi < lo or c.sigma_at(hi) < target:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if c.sigma_at(mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def rank_key(c: Candidate, budget: float) -> tuple[float, float, float, int]:
    """Short-list order: sigma per unit cost at the size that reaches 1 within the budget (else
    at the whole budget); ties as the largest-batch rule's."""
    dmax = max(c.min_dp, int(budget * TOL // c.replica_cost))
    d = smallest_dp(c, c.min_dp, dmax, 1.0) or dmax
    per_cost = c.sigma_at(d) / (d * c.replica_cost)
    return (-float(f"{per_cost:.9g}"), c.replica_cost, -float(f"{c.sigma_sum / c.replica_cost:.9g}"), c.order)


def pick(cands: Sequence[Candidate], slice_budget: float) -> tuple[Candidate, int] | None:
    """Phase 2's pick on standalone scores: the cheapest candidate reaching sigma >= 1 in the
    slice, else the highest sigma the slice buys (no replica that adds nothing)."""

    def need_of(c: Candidate) -> int | None:
        return smallest_dp(c, c.min_dp, int(slice_budget * TOL // c.replica_cost), 1.0)

    def fallback_of(c: Candidate) -> tuple[int, float] | None:
        d = int(slice_budget * TOL // c.replica_cost)
        if d < c.min_dp:
            return None
        d = smallest_dp(c, c.min_dp, d, c.sigma_at(d)) or d
        return d, c.sigma_at(d)

    return pick_rule(cands, need_of, fallback_of)


def make_rater(
    model: ModelSpec,
    plan: PoolPlan,
    demand: Demand,
    efficiency: Efficiency,
    sigmas: Sequence[float],
    *,
    max_decode_batch: int,
    prefill_token_budget: int,
    timer: PoolTimer | None = None,
) -> Rater:
    """The partner-batch rater of ``plan``'s candidate: its lane times at (batch, pool size); the
    pool size matters only where the experts are spread over the whole pool (e = t p d)."""
    lay = plan.layout
    stages = plan.stages
    pooled = default_ep(model, stages, lay.tp, lay.pp) > 1
    timers: dict[int, PoolTimer] = {} if timer is None else {lay.dp: timer}

    def timer_at(dp: int) -> PoolTimer:
        size = pool_size_grid(dp) if pooled else lay.dp
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


def pool_size_grid(dp: int) -> int:
    """The pool size a pooled-expert rater reads its step at: ``dp`` up to 8, beyond it the
    nearest point of a grid 2^(1/4) apart (the experts' sharing changes slowly with the pool size;
    one timer per grid point keeps phase 1 and 2 fast). The run uses the exact size."""
    if dp <= 8:
        return dp
    return round(2 ** (round(4 * math.log2(dp)) / 4))

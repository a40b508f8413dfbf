"""``--sigma batch-aware``: phase-1/2 capacity scores at the batch a replica actually sees.

The issue's rule (``--sigma largest-batch``, the default) rates one replica of a decode pool at the
largest batch it can hold (``max_decode_batch``, or fewer when its KV capacity holds fewer) and a
pool of d replicas at ``d x`` that. The finite run never has more than its ``C`` requests in flight
(500 by default), so a pool of d replicas decodes ``S = min(C, d x b_hold)`` sequences at once,
``b = ceil(S / d)`` per replica; a pool of thousands of cheap weight-streaming replicas then runs
near batch 1 and its throughput saturates at ``C / t_step(1)``. This option scores that:

    sigma_decode(d) = S / t_replica(b) / demand,   S = min(C, d b_hold),  b = ceil(S / d)

which equals the default ``d x sigma1`` while ``d b_hold <= C`` and is non-decreasing in d. Prefill
phases stay linear (``d x sigma1``). Phase 2 keeps the issue's rule with these scores: the cheapest
short-listed candidate reaching sigma >= 1 (found by bisection on d), else the highest; the leftover
goes to the lowest-sigma pool that still gains from more replicas. The short list ranks candidates
by sigma per unit cost at the size that reaches sigma = 1 within the budget (else at the whole
budget), so saturating candidates no longer look cheap. A change of the issue's section-6 rule:
off by default, reported in docs/planner.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from dualpath.planner.search import Candidate

SIGMA_RULES: Final = ("largest-batch", "batch-aware")
TOL: Final = 1 + 1e-12


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeCurve:
    """One replica's decode score as a function of the pool size (batch-aware rule)."""

    hold: int  # the largest batch one replica holds (b_hold)
    concurrency: int  # C: sequences in flight at most (the run's requests)
    prefill_sigma1: float  # one replica's prefill score (inf: no prefill phase)
    step_s: Callable[[int, int], float]  # one replica's decode step at batch b in a pool of d
    demand_tps: float
    pooled: bool = False  # experts spread over the whole pool: the step depends on d too
    _memo: dict[tuple[int, int], float] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def sigma(self, dp: int) -> float:
        if dp <= 0:
            return 0.0
        s = min(self.concurrency, dp * self.hold)
        b = math.ceil(s / dp)
        key = (b, dp if self.pooled else 0)
        t = self._memo.get(key)
        if t is None:
            t = self._memo[key] = self.step_s(b, dp)
        return min(dp * self.prefill_sigma1, s / t / self.demand_tps)


def smallest_dp(c: Candidate, lo: int, hi: int, target: float) -> int | None:
    """Smallest d in [lo, hi] with ``c.sigma_at(d) >= target`` (scores are non-decreasing in d)."""
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
    at the whole budget); ties as the default rule."""
    dmax = max(c.min_dp, int(budget * TOL // c.replica_cost))
    d = smallest_dp(c, c.min_dp, dmax, 1.0) or dmax
    per_cost = c.sigma_at(d) / (d * c.replica_cost)
    return (-float(f"{per_cost:.9g}"), c.replica_cost, -float(f"{c.sigma_sum / c.replica_cost:.9g}"), c.order)


def pick(cands: Sequence[Candidate], slice_budget: float) -> tuple[Candidate, int] | None:
    """The rule with batch-aware scores: cheapest candidate reaching sigma >= 1 in the slice, else
    the highest sigma the slice buys."""
    best: tuple[tuple[float, float, int], Candidate, int] | None = None
    for c in cands:
        dmax = int(slice_budget * TOL // c.replica_cost)
        need = smallest_dp(c, c.min_dp, dmax, 1.0)
        if need is not None:
            key = (need * c.replica_cost, -need * c.sigma_sum, c.order)
            if best is None or key < best[0]:
                best = (key, c, need)
    if best is not None:
        return best[1], best[2]
    fallback = None
    for c in cands:
        d = int(slice_budget * TOL // c.replica_cost)
        if d < c.min_dp:
            continue
        d = smallest_dp(c, c.min_dp, d, c.sigma_at(d)) or d  # no replica that adds nothing
        key2 = (-float(f"{c.sigma_at(d):.9g}"), -d * c.sigma_sum, c.order)
        if fallback is None or key2 < fallback[0]:
            fallback = (key2, c, d)
    return None if fallback is None else (fallback[1], fallback[2])


def fill(chosen: list[list[object]], leftover: float) -> None:
    """Leftover one replica at a time to the lowest-sigma pool that fits and still gains (bulk
    steps: just past the next-lowest pool, or up to the most it gains when alone)."""
    n = len(chosen)
    exhausted: set[int] = set()
    while True:
        lim = leftover * TOL
        sig = [r[0].sigma_at(r[1]) for r in chosen]  # type: ignore[attr-defined]
        fits = [i for i in range(n) if i not in exhausted and chosen[i][0].replica_cost <= lim]  # type: ignore[attr-defined]
        if not fits:
            return
        i = min(fits, key=lambda j: (sig[j], j))
        c: Candidate = chosen[i][0]  # type: ignore[assignment]
        d: int = chosen[i][1]  # type: ignore[assignment]
        room = int(lim // c.replica_cost)
        top = c.sigma_at(d + room)
        if top <= sig[i]:
            exhausted.add(i)
            continue
        others = [sig[j] for j in fits if j != i]
        target = min(others) if others else math.inf
        k = None
        if top > target:
            k = _smallest_k_above(c, d, room, target)
        if k is None:
            k = (smallest_dp(c, d + 1, d + room, top) or d + room) - d
        chosen[i][1] = d + k
        leftover -= k * c.replica_cost


def _smallest_k_above(c: Candidate, d: int, room: int, target: float) -> int | None:
    lo, hi = 1, room
    if c.sigma_at(d + hi) <= target:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if c.sigma_at(d + mid) > target:
            hi = mid
        else:
            lo = mid + 1
    return lo

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

from dualpath.planner.search import pick_rule

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
    output_len: float = 1000.0  # O: decode steps a request stays for
    kv_request_bytes: float = 0.0  # one mean request's prompt KV (the hand-off), hosting DA
    _memo: dict[tuple[int, int], float] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def in_flight(self, dp: int) -> int:
        """Sequences a pool of ``dp`` replicas decodes at once: ``min(C, dp x b_hold)``."""
        return min(self.concurrency, dp * self.hold)

    def sigma(self, dp: int, concurrency: int | None = None) -> float:
        """The pool's score with ``dp`` replicas; ``concurrency`` caps the sequences in flight
        below C (the KV pool's hold, for the F side of a split decode unit)."""
        if dp <= 0:
            return 0.0
        cap = self.concurrency if concurrency is None else min(self.concurrency, concurrency)
        s = min(cap, dp * self.hold)
        t = self.step(math.ceil(s / dp), dp)
        return min(dp * self.prefill_sigma1, s / t / self.demand_tps)

    def step(self, batch: int, dp: int) -> float:
        """One replica's decode step at ``batch`` sequences in a pool of ``dp`` replicas (memo)."""
        key = (batch, dp if self.pooled else 0)
        t = self._memo.get(key)
        if t is None:
            t = self._memo[key] = self.step_s(batch, dp)
        return t


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

    def need_of(c: Candidate) -> int | None:
        return smallest_dp(c, c.min_dp, int(slice_budget * TOL // c.replica_cost), 1.0)

    def fallback_of(c: Candidate) -> tuple[int, float] | None:
        d = int(slice_budget * TOL // c.replica_cost)
        if d < c.min_dp:
            return None
        d = smallest_dp(c, c.min_dp, d, c.sigma_at(d)) or d  # no replica that adds nothing
        return d, c.sigma_at(d)

    return pick_rule(cands, need_of, fallback_of)


def coupled_sigmas(
    kv_index: int,
    chosen: Sequence[tuple[Candidate, int]],
    *,
    kv_boundary: tuple[int, int] | None,
    n2n_bps: float,
) -> list[float] | None:
    """Pool sigmas of a whole allocation as the finite run paces it (``None``: no decode curve).

    The pools running decode (the KV pool and, in AF / PDAF, the F side) decode the sequences the
    KV pool holds, ``S = min(C, d_kv b_hold)``, one step taking the slower side's time. A request
    holds its KV slot from admission (before its prefill) to its last token, ``W = max(t_prefill,
    t_handoff) + O t_step``, so by Little's law the decode phase serves at most ``S / W`` requests
    per second: ``sigma_decode = S O / (demand W)`` (the issue's ``S / t_step / demand`` without
    the prefill and hand-off part of the residence). Prefill phases keep their own score."""
    kv_c, kv_d = chosen[kv_index]
    curve = kv_c.curve
    if curve is None:
        return None
    held = curve.in_flight(kv_d)
    sides = [kv_index] + [i for i, (c, _) in enumerate(chosen) if c.decode_f and i != kv_index and c.curve]
    step = max(chosen[i][0].curve.step(math.ceil(held / chosen[i][1]), chosen[i][1]) for i in sides)  # type: ignore[union-attr]
    pre = max((c.prefill_s for c, _ in chosen if c.prefill_s > 0), default=0.0)
    handoff = 0.0
    if kv_boundary is not None:
        src, dst = (chosen[i][0] for i in kv_boundary)
        handoff = curve.kv_request_bytes / (min(src.tp * src.pp, dst.tp * dst.pp) * n2n_bps)
    residence = max(pre, handoff) + curve.output_len * step
    out = []
    for i, (c, d) in enumerate(chosen):
        cv = c.curve
        if i in sides and cv is not None:
            out.append(min(d * cv.prefill_sigma1, held * cv.output_len / (cv.demand_tps * residence)))
        else:
            out.append(c.sigma_at(d))
    return out


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

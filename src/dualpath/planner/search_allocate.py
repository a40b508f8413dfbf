"""Phase 2 of the search (docs/planner.md, "The model"): budget splits, filled and ranked.

**Phase 2**: every split of the budget over the mode's pools on a 1/``grid`` grid. In each slice a
pool takes the cheapest short-listed candidate reaching sigma >= 1 (else the highest-sigma one)
(never fewer than its ``min_dp`` replicas); the unspent budget then goes one replica at a time to
the lowest-sigma pool that still fits (``partner-batch``: the allocation is rated at its partners'
batches and the leftover goes to the side that binds, search_fill.py). ``sigma_joint = min`` over
pools. Besides that rule's pick,
each split also yields the variants where one pool takes another of its short-listed candidates (so
a one-pool mode, ND, ranks its whole short list too). Allocations are ranked by sigma_joint (ties:
lower cost), duplicates dropped. Deterministic: every order has a total tie-break.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from dualpath.planner import search_fill, sigma_partner
from dualpath.planner.pools import Allocation, PoolPlan
from dualpath.planner.search import pick_rule

if TYPE_CHECKING:
    from dualpath.planner.modes import ModeSpec, PoolSpec
    from dualpath.planner.search import Candidate, Counts
    from dualpath.planner.search_fill import Coupling


def _pick(cands: Sequence[Candidate], slice_budget: float) -> tuple[Candidate, int] | None:
    """The rule: cheapest candidate reaching sigma >= 1 within the slice, else the highest sigma."""
    cap = slice_budget * (1 + 1e-12)

    def need_of(c: Candidate) -> int | None:
        need = max(c.min_dp, math.ceil(1.0 / c.sigma1 - 1e-12))
        return need if need * c.replica_cost <= cap else None

    def fallback_of(c: Candidate) -> tuple[int, float] | None:
        d = int(cap // c.replica_cost)
        return None if d < c.min_dp else (d, d * c.sigma1)

    return pick_rule(cands, need_of, fallback_of)


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


def _variants(
    base: list[tuple[Candidate, int]],
    pools: Sequence[PoolSpec],
    split: tuple[int, ...],
    shortlists: Mapping[str, Sequence[Sequence[Candidate]]],
    pick: Callable[[int, int, Sequence[Candidate], int], tuple[Candidate, int] | None],
) -> list[list[tuple[Candidate, int]]]:
    """The split's base picks, then each with one pool's pick swapped for another group's best."""
    variants = [base]
    for i, (p, k) in enumerate(zip(pools, split, strict=True)):
        for g, group in enumerate(shortlists[p.name]):
            if base[i][0] in group:
                continue
            other = pick(i, g, group, k)
            if other is not None:
                variants.append([*base[:i], other, *base[i + 1 :]])
    return variants


def _filled_plans(
    chosen: list[list[object]], pools: Sequence[PoolSpec], coupling: Coupling | None, leftover: float
) -> tuple[PoolPlan, ...]:
    """Spend ``leftover`` on more replicas (``chosen`` updated in place), then each pool's plan:
    rated by the largest-batch rule (``coupling`` None) or at its partners' batches."""
    if coupling is None:
        _fill(chosen, leftover)
        return tuple(
            c.plan(p, d)  # type: ignore[attr-defined]
            for (c, d), p in zip(chosen, pools, strict=True)
        )
    coupled = search_fill.fill(coupling, chosen, leftover)
    return tuple(
        dataclasses.replace(c.plan(p, d), sigma=x)  # type: ignore[attr-defined]
        for (c, d), p, x in zip(chosen, pools, coupled, strict=True)
    )


def phase2(
    mode: ModeSpec,
    shortlists: Mapping[str, Sequence[Sequence[Candidate]]],
    *,
    budget: float,
    grid: int,
    counts: Counts,
    coupling: Coupling | None = None,
) -> list[Allocation]:
    """Ranked, de-duplicated allocations of ``mode`` (best first). ``coupling`` (partner-batch):
    rate each allocation at its partners' batches; None: the largest-batch rule."""
    rule = sigma_partner.pick if coupling is not None else _pick
    memo: dict[tuple[int, int, int], tuple[Candidate, int] | None] = {}

    def pick(pool: int, group: int, cands: Sequence[Candidate], k: int) -> tuple[Candidate, int] | None:
        """The rule's pick in a slice of k/grid of the budget (the same slices recur across splits)."""
        key = (pool, group, k)
        if key not in memo:
            memo[key] = rule(cands, budget * k / grid)
        return memo[key]

    pools = mode.pools
    seen: dict[tuple[object, ...], Allocation] = {}
    started: set[tuple[tuple[int, int], ...]] = set()  # many splits start alike
    flat = [[c for g in shortlists[p.name] for c in g] for p in pools]
    for split in _splits(len(pools), grid):
        base = [pick(i, -1, f, k) for i, (f, k) in enumerate(zip(flat, split, strict=True))]
        if any(b is None for b in base):
            continue
        for var in _variants(base, pools, split, shortlists, pick):  # type: ignore[arg-type]
            chosen: list[list[object]] = [[c, d] for c, d in var]
            spent = sum(c.replica_cost * d for c, d in var)
            if spent > budget * (1 + 1e-9):
                continue
            start = tuple((id(c), d) for c, d in var)  # the fill is a function of its start,
            if start in started:  # so an allocation seen once is already ranked
                continue
            started.add(start)
            plans = _filled_plans(chosen, pools, coupling, budget - spent)
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

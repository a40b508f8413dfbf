"""Phase 2 under ``--sigma partner-batch``: an allocation rated at its partners' batches, and the
leftover budget handed to the side that binds.

**Rating** (:meth:`Coupling.sigmas`). Every unit (modes.UnitSpec) rates its pools together:

- decode: ``S = min(C, d_kv x b_hold, max_decode_batch x min d of the decode pools)`` sequences
  (the run's admission limits). A merged unit's pool scores ``S / t(S) / demand``. In a split unit
  the F side (DF) is rated at S spread over its own lanes, ``S / t_F / demand``, and the A side (DA)
  at the unit's step at that S, ``S / t_unit / demand`` with ``t_unit = af_layer_s(t_A, t_F, t_x,
  m)`` (its lanes set the batch and wait for F and the link);
- prefill: a merged unit's pool keeps its linear score ``d x sigma1``. In a split unit the A lanes
  hand ``T = lanes_A x`` one lane's tokens to F per iteration: F is rated at T over its lanes,
  ``T / t_F / demand``, and A at the unit's iteration, ``T / t_unit / demand``.

A pool's score is the smaller of its phases'; ``sigma_joint = min`` over pools, the unit's closed
form. The A side's score carries the unit's step, so it is never above its partner's: the F side
binds when the two are within ``BIND_TOL``, the A side otherwise.

**Leftover** (:func:`fill`): one bulk step at a time to the lowest-scored pool (its F partner when
F binds its unit) whose step raises its score; a pool that gains nothing is skipped until another
pool grows. A step is 1/16 of the pool's replicas (at least one), doubled while the same pool keeps
winning, so budgets that buy thousands of replicas take a few dozen rounds; the result is the
one-at-a-time rule's within a step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from dualpath.planner.parallel import af_layer_s
from dualpath.planner.sigma_partner import TOL

if TYPE_CHECKING:
    from dualpath.planner.modes import ModeSpec
    from dualpath.planner.search import Candidate
    from dualpath.planner.sigma_partner import Rater

BIND_TOL: Final = 0.02  # the F side binds its unit when the A side's score is within 2% of it
STEP_DIV: Final = 16  # a fill step starts at 1/16 of the pool's replicas


@dataclass(frozen=True, slots=True, kw_only=True)
class Coupling:
    """What rates an allocation of one mode (indices are the mode's pool order)."""

    units: tuple[tuple[int, int, tuple[str, ...]], ...]  # (A pool, F pool, phases)
    kv_index: int
    decode_indices: tuple[int, ...]
    concurrency: int  # C: the run's requests
    max_decode_batch: int
    microbatches: int
    n2n_bps: float  # per device and direction
    latency_s: float
    prefill_crossings: int
    decode_crossings: int
    demand_prefill_tps: float
    demand_decode_tps: float

    @classmethod
    def of(cls, mode: ModeSpec, **kw: float | int) -> Coupling:
        names = [p.name for p in mode.pools]
        units = tuple((names.index(u.a_pool), names.index(u.f_pool), tuple(u.phases)) for u in mode.units)
        dec = tuple(i for i, p in enumerate(mode.pools) if "decode" in p.phases)
        return cls(units=units, kv_index=names.index(mode.kv_pool.name), decode_indices=dec, **kw)  # type: ignore[arg-type]

    def partners(self) -> dict[int, int]:
        """A side -> F side of every split unit."""
        return {a: f for a, f, _ in self.units if a != f}

    def sigmas(self, cands: Sequence[Candidate], dps: Sequence[int]) -> list[float]:
        """Each pool's score in the allocation ``cands`` x ``dps`` (see the module docstring)."""
        out = [math.inf] * len(cands)
        raters: list[Rater] = [c.rater for c in cands]  # type: ignore[misc]
        for a, f, phases in self.units:
            if "prefill" in phases:
                self._prefill(out, raters, dps, a, f)
            if "decode" in phases:
                self._decode(out, raters, dps, a, f)
        return out

    def _link_s(self, ra: Rater, rf: Rater, da: int, df: int, tokens: float, act: float, n: int) -> float:
        bw = min(ra.devices * da, rf.devices * df) * self.n2n_bps
        return n * tokens * act / bw + n * self.latency_s

    def _prefill(self, out: list[float], raters: Sequence[Rater], dps: Sequence[int], a: int, f: int) -> None:
        ra, rf, da, df = raters[a], raters[f], dps[a], dps[f]
        if a == f:
            out[a] = min(out[a], da * ra.prefill_sigma1)
            return
        tokens = ra.lanes * da * ra.pre_lane_tokens
        t_f = rf.pf_lane_s(math.ceil(tokens / (rf.lanes * df)), df)
        act = max(ra.act_prefill, rf.act_prefill)
        t_x = self._link_s(ra, rf, da, df, tokens, act, self.prefill_crossings)
        t_unit = af_layer_s(ra.pre_lane_s, t_f, t_x, self.microbatches)
        out[a] = min(out[a], tokens / t_unit / self.demand_prefill_tps)
        out[f] = min(out[f], tokens / t_f / self.demand_prefill_tps)

    def _decode(self, out: list[float], raters: Sequence[Rater], dps: Sequence[int], a: int, f: int) -> None:
        ra, rf, da, df = raters[a], raters[f], dps[a], dps[f]
        kv = self.kv_index
        slots = self.max_decode_batch * min(dps[i] for i in self.decode_indices)
        held = min(self.concurrency, dps[kv] * raters[kv].hold, slots)
        t_a = ra.dec_lane_s(math.ceil(held / (ra.lanes * da)), da)
        if a == f:
            out[a] = min(out[a], held / t_a / self.demand_decode_tps)
            return
        t_f = rf.dec_lane_s(math.ceil(held / (rf.lanes * df)), df)
        act = max(ra.act_decode, rf.act_decode)
        t_x = self._link_s(ra, rf, da, df, held, act, self.decode_crossings)
        t_unit = af_layer_s(t_a, t_f, t_x, self.microbatches)
        out[a] = min(out[a], held / t_unit / self.demand_decode_tps)
        out[f] = min(out[f], held / t_f / self.demand_decode_tps)


def fill(coupling: Coupling, chosen: list[list[object]], leftover: float) -> list[float]:
    """Hand ``leftover`` to the binding side, a bulk step at a time (module docstring); ``chosen``
    rows are [candidate, dp], mutated. Returns the pools' scores at the end."""
    cands: list[Candidate] = [r[0] for r in chosen]  # type: ignore[misc]
    dps: list[int] = [r[1] for r in chosen]  # type: ignore[misc]
    cost = [c.replica_cost for c in cands]
    partner = coupling.partners()
    memo: dict[tuple[int, ...], list[float]] = {}

    def rate(d: list[int]) -> list[float]:
        key = tuple(d)
        got = memo.get(key)
        if got is None:
            got = memo[key] = coupling.sigmas(cands, d)
        return got

    skipped: set[int] = set()
    streak = (-1, 0)  # (pool, consecutive wins)
    while True:
        lim = leftover * TOL
        fits = [i for i in range(len(cands)) if i not in skipped and cost[i] <= lim]
        if not fits:
            break
        sig = rate(dps)
        i = min(fits, key=lambda j: (sig[j], j))
        j = partner.get(i)
        if j is not None and j in fits and sig[i] >= (1 - BIND_TOL) * sig[j]:
            i = j  # F binds the unit
        wins = streak[1] + 1 if streak[0] == i else 0
        k = min(int(lim // cost[i]), max(1, dps[i] // STEP_DIV) << min(wins, 20))
        trial = list(dps)
        trial[i] += k
        if rate(trial)[i] <= sig[i]:
            skipped.add(i)
            streak = (-1, 0)
            continue
        dps, leftover, streak = trial, leftover - k * cost[i], (i, wins)
        skipped.clear()
    for row, d in zip(chosen, dps, strict=True):
        row[1] = d
    return rate(dps)

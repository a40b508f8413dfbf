"""Parallel layouts (TP, PP, DP, EP) of one pool, and the step times of its stages on one lane.

Model (heteropanacea.md section III; docs/planner.md, "The model"):

- **TP t**: compute and bandwidth scale by t (weights sharded, KV heads split): each device does
  ``work / t``. A ring all-reduce of ``2 (t-1)/t x tokens x hidden x act_bytes`` goes over D2D after
  every attention output projection (A stages) and every FFN down projection (F stages).
- **PP p**: layers split over p groups of t devices. A micro-batch passes the p groups one after the
  other, so one request's time does not shrink (``p x time(work / (t p))`` plus ``p - 1`` hand-offs
  of its hidden states over D2D); the gain is overlap only. A replica is therefore modelled as
  ``p`` **lanes**, each a micro-batch stream with that latency, sharing the replica's memory.
- **DP d**: d replicas, no communication: ``d x p`` lanes in a pool.
- **EP e**: routed experts spread over e devices; ``(e-1)/e`` of the dispatch + combine bytes
  (``2 x tokens x active experts x hidden x act_bytes`` per MoE layer) cross D2D, sent by the t
  devices that hold the tokens. e is not counted in the device product (``e <= t p d``). With
  ``e = t p d`` (the default for MoE F pools) a MoE layer serves the tokens of all d replicas at
  once: each device streams its share of the experts that those tokens touch, so a lane carries
  ``routed(tokens x d) / d`` expert bytes instead of ``routed(tokens)``.
- **Residency**: a device holds its stages' non-expert weights / (t p), its routed experts / e, and
  the KV of the requests admitted to it (the rest of its capacity).

Nothing here schedules events: these are the closed forms the run and the search share.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Final

from dualpath.core.errors import require
from dualpath.cost.stages import (
    StageWork,
    hidden_act_bytes_per_token,
    stage_roofline_s,
    stage_time_s,
    stage_weight_bytes,
    stage_work,
)
from dualpath.planner.links import D2D_DOMAIN, D2D_GBS, allreduce_bytes, d2d_time_s, ep_bytes

if TYPE_CHECKING:
    from dualpath.cost.efficiency import Efficiency
    from dualpath.spec.device import Device
    from dualpath.spec.models import ModelSpec

DECODE_CTX_GRID: Final = 128  # decode work is read at contexts 128 tokens apart, linear between
TP_DEGREES: Final = (1, 2, 4, 8)  # TP stays inside one D2D domain (8 devices)
PP_DEGREES: Final = (1, 2, 4, 8, 16, 32)  # enough to hold the largest model on small memories
assert max(TP_DEGREES) <= D2D_DOMAIN


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """(t, p, d, e) of one pool; ``num_devices = t p d``."""

    tp: int
    pp: int
    dp: int
    ep: int

    def __post_init__(self) -> None:
        for key in ("tp", "pp", "dp", "ep"):
            require(getattr(self, key) >= 1, key, getattr(self, key), "must be >= 1")
        require(self.ep <= self.num_devices, "ep", self.ep, f"must be <= t*p*d = {self.num_devices}")

    @property
    def replica_devices(self) -> int:
        return self.tp * self.pp

    @property
    def num_devices(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def lanes(self) -> int:
        return self.pp * self.dp


def default_ep(model: ModelSpec, stages: Iterable[str], tp: int, pp: int, dp: int = 1) -> int:
    """EP degree of a pool: the routed experts are spread over all the pool's ``t p d`` devices
    when it runs an F stage of an MoE model (each MoE layer then serves the tokens of every
    replica at once, as in attention-DP + expert-EP serving), else 1."""
    has_f = any(s in ("pf", "df") for s in stages)
    return tp * pp * dp if has_f and model.is_moe else 1


# ---- residency ------------------------------------------------------------------------------
def split_weight_bytes(model: ModelSpec, bits: Mapping[str, int]) -> tuple[float, float]:
    """(non-expert, routed-expert) weight bytes a pool hosting the stages of ``bits`` holds in all.
    Stages of one side that share weights (PA and DA, PF and DF) hold one copy per distinct
    precision."""
    non_expert = experts = 0.0
    for group in (("pa", "da"), ("pf", "df")):
        seen: set[int] = set()
        for stage in group:
            if stage in bits and bits[stage] not in seen:
                seen.add(bits[stage])
                ne, ex = stage_weight_bytes(model, stage, bits[stage])  # type: ignore[arg-type]
                non_expert += ne
                experts += ex
    return non_expert, experts


def weight_bytes_per_device(model: ModelSpec, bits: Mapping[str, int], tp: int, pp: int, ep: int) -> float:
    """Weights one device of the pool holds: non-expert / (t p) + routed experts / e."""
    non_expert, experts = split_weight_bytes(model, bits)
    return non_expert / (tp * pp) + experts / ep


def min_replicas(
    model: ModelSpec, bits: Mapping[str, int], tp: int, pp: int, capacity_bytes: float
) -> int | None:
    """Fewest replicas of ``t x p`` devices whose devices hold their weights, experts spread over
    all ``t p d`` of them (MoE F pools, ``default_ep``); None when the non-expert share alone does
    not fit."""
    non_expert, experts = split_weight_bytes(model, bits)
    room = capacity_bytes - non_expert / (tp * pp)
    if experts <= 0 or default_ep(model, bits, tp, pp) == 1:
        return 1 if room >= experts else None
    if room <= 0:
        return None
    return max(1, math.ceil(experts / (tp * pp * room) - 1e-9))


def kv_capacity_bytes(device: Device, weights_per_device: float, num_devices: int) -> float:
    """Bytes left for KV on ``num_devices`` devices after their weights (0 when they do not fit)."""
    return max(device.capacity_bytes - weights_per_device, 0.0) * num_devices


# ---- one stage on one lane ------------------------------------------------------------------
def _scaled(work: StageWork, factor: float, num_layers: int) -> StageWork:
    return StageWork(
        flops=work.flops * factor,
        weight_bytes=work.weight_bytes * factor,
        kv_read_bytes=work.kv_read_bytes * factor,
        kv_write_bytes=work.kv_write_bytes * factor,
        act_bytes=work.act_bytes * factor,
        num_layers=num_layers,
        stage=work.stage,
        attention_flops=work.attention_flops * factor,
        routed_flops=work.routed_flops * factor,
        routed_weight_bytes=work.routed_weight_bytes * factor,
    )


def _lerp(a: StageWork, b: StageWork, w: float) -> StageWork:
    if w <= 0.0:
        return a
    v = 1.0 - w
    return replace(
        a,
        flops=a.flops * v + b.flops * w,
        kv_read_bytes=a.kv_read_bytes * v + b.kv_read_bytes * w,
        kv_write_bytes=a.kv_write_bytes * v + b.kv_write_bytes * w,
        attention_flops=a.attention_flops * v + b.attention_flops * w,
    )


def sum_prefill(works: Sequence[StageWork]) -> StageWork:
    """Several prompts in one attention iteration: work terms add, the weights stream once."""
    first = works[0]
    if len(works) == 1:
        return first
    return replace(
        first,
        flops=sum(w.flops for w in works),
        kv_read_bytes=sum(w.kv_read_bytes for w in works),
        kv_write_bytes=sum(w.kv_write_bytes for w in works),
        act_bytes=sum(w.act_bytes for w in works),
        attention_flops=sum(w.attention_flops for w in works),
    )


@lru_cache(maxsize=200_000)
def cached_work(
    model: ModelSpec, stage: str, batch: int, context_len: int, bits: int, cached_len: int = 0
) -> StageWork:
    """:func:`stage_work`, memoised (the run asks for the same shapes many times)."""
    return stage_work(
        model,
        stage,  # type: ignore[arg-type]
        batch=batch,
        context_len=context_len,
        bits=bits,
        cached_len=cached_len,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTimer:
    """Time of one stage on one lane of a pool (t devices per PP group, p groups)."""

    model: ModelSpec
    stage: str
    bits: int
    device: Device
    tp: int
    pp: int
    ep: int
    efficiency: Efficiency
    d2d_gbs: float = D2D_GBS
    pp_handoff: bool = True  # the pool's first stage pays its PP hand-offs (merged: once)
    expert_groups: int = 1  # replicas whose tokens share the experts (e / (t p)); 1: replica-local
    _memo: dict[tuple[int, int], tuple[float, ...]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    def _group_work(self, work: StageWork) -> StageWork:
        """One PP group's share of one TP device: ``work / (t p)`` over ``layers / p``."""
        t, p = self.tp, self.pp
        return _scaled(work, 1.0 / (t * p), max(1, round(work.num_layers / p)))

    def lane_s(self, work: StageWork, tokens: float) -> float:
        """Latency of one micro-batch through the lane: p groups of compute + collectives."""
        per_group = stage_time_s(
            self._group_work(work), self.device, efficiency=self.efficiency, bits=self.bits
        )
        return self.pp * per_group + self.collectives_s(tokens)

    def _point(self, work: StageWork) -> tuple[float, float, float]:
        """(compute s, memory s, fixed s) of one group's share: ``stage_time_s`` is
        ``max(compute, memory) + fixed``, and compute and memory are linear in the work."""
        w = self._group_work(work)
        c, m = stage_roofline_s(w, self.device, efficiency=self.efficiency, bits=self.bits)
        return c, m, stage_time_s(w, self.device, efficiency=self.efficiency, bits=self.bits) - max(c, m)

    def collectives_s(self, tokens: float) -> float:
        """TP all-reduce per layer, EP all-to-all per MoE layer, PP hand-offs (all over D2D)."""
        model = self.model
        act = hidden_act_bytes_per_token(model, self.bits)
        message = tokens * act
        out = model.num_layers * d2d_time_s(allreduce_bytes(message, self.tp), 1, self.d2d_gbs)
        if self.stage in ("pf", "df") and model.is_moe and self.ep > 1:
            dispatch = 2.0 * message * model.num_active_experts * model.num_moe_layers
            out += d2d_time_s(ep_bytes(dispatch, self.ep), self.tp, self.d2d_gbs)
        if self.pp > 1 and self.pp_handoff:  # one hand-off per group boundary
            out += d2d_time_s((self.pp - 1) * message, self.tp, self.d2d_gbs)
        return out

    def prefill_s(self, lengths: Sequence[int]) -> float:
        """One lane's prefill iteration over prompts of ``lengths`` (A: per prompt causal
        attention; F: all tokens as one GEMM batch)."""
        model, bits = self.model, self.bits
        tokens = int(sum(lengths))
        if self.stage == "pa":
            work = sum_prefill([cached_work(model, "pa", 1, int(n), bits) for n in lengths])
        else:
            work = cached_work(model, "pf", 1, tokens, bits)
        return self.lane_s(work, tokens)

    def _shared_experts(self, work: StageWork, tokens: int) -> StageWork:
        """Pool-wide EP: the lane's routed-expert bytes become ``routed(tokens x g) / g``."""
        g = self.expert_groups
        if g <= 1 or self.stage not in ("pf", "df") or work.routed_weight_bytes <= 0:
            return work
        phase_batch = (1, tokens * g) if self.stage == "pf" else (tokens * g, 1)
        routed = (
            cached_work(self.model, self.stage, phase_batch[0], phase_batch[1], self.bits).routed_weight_bytes
            / g
        )
        return replace(
            work,
            weight_bytes=work.weight_bytes - work.routed_weight_bytes + routed,
            routed_weight_bytes=routed,
        )

    def prefill_uniform_s(self, num_prompts: int, length: int) -> float:
        """:meth:`prefill_s` of ``num_prompts`` prompts of ``length`` tokens each (the search)."""
        tokens = num_prompts * length
        if self.stage == "pa":
            work = cached_work(self.model, "pa", num_prompts, length, self.bits)
        else:
            work = self._shared_experts(cached_work(self.model, "pf", 1, tokens, self.bits), tokens)
        return self.lane_s(work, tokens)

    def decode_s(self, batch: int, context_len: float) -> float:
        """One decode step of ``batch`` sequences whose mean cached context is ``context_len``.
        The work is read at contexts ``DECODE_CTX_GRID`` tokens apart and interpolated linearly
        (exact for dense attention; CSA/HCA compression and top-k caps are staircases or kinks in
        context, smoothed here), so a run of steps sums in closed form between grid points."""
        if batch <= 0:
            return 0.0
        g = DECODE_CTX_GRID
        base = int(context_len // g) * g if self.stage == "da" else 0
        key = (batch, base)
        pts = self._memo.get(key)
        if pts is None:
            model, bits = self.model, self.bits
            if self.stage == "df":
                p0 = self._point(self._shared_experts(cached_work(model, "df", batch, 1, bits), batch))
                p1 = p0
            else:
                p0 = self._point(cached_work(model, "da", batch, base, bits))
                p1 = self._point(cached_work(model, "da", batch, base + g, bits))
            pts = self._memo[key] = (*p0, *p1, self.collectives_s(batch))
        w = (context_len - base) / g if self.stage == "da" else 0.0
        c = pts[0] + (pts[3] - pts[0]) * w
        m = pts[1] + (pts[4] - pts[1]) * w
        return self.pp * (max(c, m) + pts[2]) + pts[6]


def af_layer_s(t_a: float, t_f: float, t_x: float, microbatches: int) -> float:
    """One layer (or the sum over layers) of an A/F split: A, then the activations to F, F, and
    back. With m micro-batches (ping-pong) the pipeline runs at the slowest of its three servers,
    or the whole round trip shared by m: ``max(t_A, t_F, t_x, (t_A + t_F + 2 t_x) / m)``; m = 1 is
    sequential. An A/F imbalance stalls the pipeline."""
    require(microbatches >= 1, "af_microbatches", microbatches, "must be >= 1")
    round_trip = t_a + t_f + 2.0 * t_x
    if microbatches == 1:
        return round_trip
    return max(t_a, t_f, t_x, round_trip / microbatches)

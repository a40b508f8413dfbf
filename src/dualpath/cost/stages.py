"""Stage work model of the disaggregation planner: FLOPs and bytes of PA, PF, DA and DF.

One forward iteration of the whole model (all layers) for one stage, with the byte terms kept
apart (heteropanacea.md, section III):

- **A stages** (``pa`` prefill attention, ``da`` decode attention) own the attention core and the
  attention-side weights: Q/K/V/O projections (low-rank Q, grouped low-rank O), the DSA/CSA indexer
  and the CSA/HCA compressor (``spec.params.attention_params``; norms are ignored, < 0.1%).
- **F stages** (``pf``, ``df``) own the router, shared and routed experts or the dense MLP, and the
  embedding + LM head (``spec.params.ffn_non_expert_params`` and the routed experts).

FLOPs are the spec's: linear ``2 x`` active parameters per token (LM head on every token, as
``ModelSpec.linear_flops_per_token``), attention causal and quadratic with windows, DSA top-k and
CSA/HCA compression respected (``ModelSpec.attention_flops``). So ``pa + pf`` FLOPs equal
``ModelSpec.prefill_flops`` and the A/F linear shares add up to ``linear_flops_per_token``.

Bytes come from element counts times the stage's element bytes (``bits / 8``; the dtype_bytes
ablation overrides it), never from ``ModelSpec.weight_bytes``:

- ``weight_bytes``: the stage's weights streamed once per iteration (F: non-expert weights + the
  routed experts the iteration's tokens touch, uniform routing, as ``shapes.touched_local_experts``);
- ``kv_read_bytes``: decode reads each context's retained KV (window-capped layers their window,
  DSA its top-k tokens, CSA its top-k compressed entries, HCA all of them) plus the indexer keys it
  scores; prefill starts from an empty cache and reads nothing back;
- ``kv_write_bytes``: prefill writes the KV the prompt leaves behind (what PA hands to DA); decode
  writes one raw entry (+ indexer key) per new token and layer;
- ``act_bytes``: the hidden state into and out of the stage, ``2 x tokens x hidden`` per layer: what
  crosses an A/F boundary.

Everything per model is memoised (by identity); a call is closed form in batch and context, and
attention FLOPs cost one spec call per group of alike layers (memoised per context).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from dualpath.core.errors import ConfigError, require
from dualpath.cost.efficiency import IDEAL_EFFICIENCY, Efficiency, roofline_s
from dualpath.cost.stage_shapes import attention_flops as _attention_flops
from dualpath.cost.stage_shapes import coefficients as _coefficients
from dualpath.cost.stage_shapes import kv_entries as _kv_entries
from dualpath.spec.device import check_bits

if TYPE_CHECKING:
    from dualpath.spec.device import Device
    from dualpath.spec.models import ModelSpec

Stage = Literal["pa", "pf", "da", "df"]
STAGES: tuple[Stage, ...] = ("pa", "pf", "da", "df")
ATTENTION_STAGES = ("pa", "da")
PREFILL_STAGES = ("pa", "pf")


@dataclass(frozen=True, slots=True, kw_only=True)
class StageWork:
    """One forward iteration of the whole model (all layers) for one stage."""

    flops: float
    weight_bytes: float  # weights streamed (F stages: non-expert + touched experts)
    kv_read_bytes: float
    kv_write_bytes: float
    act_bytes: float  # hidden in + out per layer x layers (what crosses an A/F boundary)
    num_layers: int
    stage: Stage | None = None
    attention_flops: float = 0.0  # the attention core's share of ``flops`` (A stages)
    routed_flops: float = 0.0  # the routed experts' share of ``flops`` (F stages)
    routed_weight_bytes: float = 0.0  # the touched experts' share of ``weight_bytes``

    def total_bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.act_bytes

    def kv_bytes(self) -> float:
        return self.kv_read_bytes + self.kv_write_bytes

    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved."""
        total = self.total_bytes()
        return self.flops / total if total > 0 else math.inf

    def kv_share(self) -> float:
        """(KV read + KV written) / all bytes."""
        total = self.total_bytes()
        return self.kv_bytes() / total if total > 0 else 0.0


def element_bytes(model: ModelSpec, bits: int, *, kv: bool = False) -> float:
    """Bytes per weight/activation (``kv=True``: per KV value) element at ``bits``; the
    dtype_bytes ablation (``ModelSpec.dtype_bytes_override``) replaces ``bits / 8``."""
    check_bits(bits)
    override = model.dtype_bytes_override
    if override is not None and (not kv or model.dtype_override_kv):
        return override
    return bits / 8


def kv_cache_bytes(model: ModelSpec, context_len: int, bits: int = 16) -> float:
    """KV (+ indexer keys) one context of ``context_len`` tokens keeps, all layers, at ``bits``."""
    require(context_len >= 0, "context_len", context_len, "must be >= 0")
    c = _coefficients(model)
    entries, keys = _kv_entries(c, context_len, read=False)
    return (entries * c.kv_elements + keys * c.index_elements) * element_bytes(model, bits, kv=True)


def kv_bytes_per_token(model: ModelSpec, bits: int = 16) -> float:
    """Upper bound per token, all layers: every layer keeps the token's entry (+ DSA indexer
    key). Windowed and compressed layers keep less at long context: use :func:`kv_cache_bytes`
    for the exact bytes of a context."""
    c = _coefficients(model)
    per_layer = c.kv_elements + (0 if c.csa else c.index_elements)
    return c.num_layers * per_layer * element_bytes(model, bits, kv=True)


def hidden_act_bytes_per_token(model: ModelSpec, bits: int = 16) -> float:
    """One token's hidden state, one layer, one way (what an A/F boundary carries)."""
    return model.hidden_size * element_bytes(model, bits)


def stage_weight_bytes(model: ModelSpec, stage: Stage, bits: int = 16) -> tuple[float, float]:
    """(non-expert, routed-expert) weight bytes the stage holds, whole model."""
    _check_stage(stage)
    c = _coefficients(model)
    eb = element_bytes(model, bits)
    if stage in ATTENTION_STAGES:
        return c.a_weight_elements * eb, 0.0
    routed = c.num_moe_layers * c.num_routed * c.expert_elements
    return c.f_weight_elements * eb, routed * eb


def touched_experts(model: ModelSpec, num_tokens: float) -> float:
    """Expected distinct routed experts of one MoE layer that ``num_tokens`` tokens hit."""
    c = _coefficients(model)
    if not c.num_routed or num_tokens <= 0:
        return 0.0
    miss = 1.0 - c.num_active / c.num_routed
    return c.num_routed * (1.0 - math.exp(num_tokens * math.log(miss)) if miss > 0 else 1.0)


def stage_work(
    model: ModelSpec, stage: Stage, *, batch: int, context_len: int, bits: int = 16, cached_len: int = 0
) -> StageWork:
    """Work of one iteration of ``stage``. Prefill (pa, pf): ``batch`` prompts of ``context_len``
    new tokens each, causal, after ``cached_len`` tokens already prefilled (0: an empty cache; > 0:
    a later chunk of a chunked prefill, which reads the prefix's retained KV once and writes only
    its own tokens' KV). Decode (da, df): ``batch`` sequences, each with ``context_len`` cached
    tokens and one new token."""
    _check_stage(stage)
    require(batch >= 0, "batch", batch, "must be >= 0")
    require(context_len >= 0, "context_len", context_len, "must be >= 0")
    require(cached_len >= 0, "cached_len", cached_len, "must be >= 0")
    if cached_len and stage == "pa":
        return _chunk_work(model, batch, context_len, bits, cached_len)
    c = _coefficients(model)
    eb = element_bytes(model, bits)
    kv_eb = element_bytes(model, bits, kv=True)
    prefill = stage in PREFILL_STAGES
    tokens = batch * context_len if prefill else batch
    act = 2.0 * tokens * c.hidden * c.num_layers * eb
    if stage in ATTENTION_STAGES:
        core = batch * (
            _attention_flops(model, 0, context_len) if prefill else _attention_flops(model, context_len, 1)
        )
        if prefill:
            entries, keys = _kv_entries(c, context_len, read=False)
            kv_read, kv_write = 0.0, batch * (entries * c.kv_elements + keys * c.index_elements)
        else:
            entries, keys = _kv_entries(c, context_len, read=True)
            kv_read = batch * (entries * c.kv_elements + keys * c.index_elements)
            kv_write = batch * c.num_layers * (c.kv_elements + (0 if c.csa else c.index_elements))
        return StageWork(
            flops=tokens * c.a_linear_flops_per_token + core,
            weight_bytes=c.a_weight_elements * eb,
            kv_read_bytes=kv_read * kv_eb,
            kv_write_bytes=kv_write * kv_eb,
            act_bytes=act,
            num_layers=c.num_layers,
            stage=stage,
            attention_flops=core,
        )
    routed = c.num_moe_layers * touched_experts(model, tokens) * c.expert_elements * eb
    return StageWork(
        flops=tokens * c.f_linear_flops_per_token,
        weight_bytes=c.f_weight_elements * eb + routed,
        kv_read_bytes=0.0,
        kv_write_bytes=0.0,
        act_bytes=act,
        num_layers=c.num_layers,
        stage=stage,
        routed_flops=tokens * c.routed_flops_per_token,
        routed_weight_bytes=routed,
    )


def _chunk_work(model: ModelSpec, batch: int, new_len: int, bits: int, cached_len: int) -> StageWork:
    """Prefill attention of ``new_len`` tokens after ``cached_len`` (``batch`` such chunks)."""
    c = _coefficients(model)
    eb, kv_eb = element_bytes(model, bits), element_bytes(model, bits, kv=True)
    tokens = batch * new_len
    old, old_keys = _kv_entries(c, cached_len, read=False)
    new, new_keys = _kv_entries(c, cached_len + new_len, read=False)
    core = batch * _attention_flops(model, cached_len, new_len)
    per_entry = c.kv_elements, c.index_elements
    return StageWork(
        flops=tokens * c.a_linear_flops_per_token + core,
        weight_bytes=c.a_weight_elements * eb,
        kv_read_bytes=batch * (old * per_entry[0] + old_keys * per_entry[1]) * kv_eb,
        kv_write_bytes=batch * ((new - old) * per_entry[0] + (new_keys - old_keys) * per_entry[1]) * kv_eb,
        act_bytes=2.0 * tokens * c.hidden * c.num_layers * eb,
        num_layers=c.num_layers,
        stage="pa",
        attention_flops=core,
    )


def merge_works(works: list[StageWork]) -> StageWork:
    """One iteration doing several works of the same A stage (prefill chunks and a decode step
    mixed in one batch): FLOPs, KV and activation bytes add; the weights stream once."""
    first = works[0]
    return StageWork(
        flops=sum(w.flops for w in works),
        weight_bytes=max(w.weight_bytes for w in works),
        kv_read_bytes=sum(w.kv_read_bytes for w in works),
        kv_write_bytes=sum(w.kv_write_bytes for w in works),
        act_bytes=sum(w.act_bytes for w in works),
        num_layers=first.num_layers,
        stage=first.stage,
        attention_flops=sum(w.attention_flops for w in works),
        routed_flops=sum(w.routed_flops for w in works),
        routed_weight_bytes=max(w.routed_weight_bytes for w in works),
    )


def stage_time_s(
    work: StageWork, device: Device, *, efficiency: Efficiency = IDEAL_EFFICIENCY, bits: int = 16
) -> float:
    """Roofline time of ``work`` on ``device``: ``max(flops / peak, bytes / bandwidth)`` (the
    paper's Eq. 1; ``cost.efficiency.roofline_s``, the function every cost model uses) with the
    efficiencies of ``efficiency`` (IDEAL: all 1.0, no launch term). Fitted efficiencies rate
    attention FLOPs / KV bytes, routed experts and the other GEMMs separately (as BF16-equivalent
    FLOPs and bytes at full rate) and add ``kernels x launch`` per layer."""
    flops, num_bytes = _effective(work, efficiency, bits)
    if efficiency is IDEAL_EFFICIENCY:
        kernels = 0
    else:
        kernels = work.num_layers * (
            efficiency.attention_kernels
            if work.stage in ATTENTION_STAGES
            else efficiency.dense_kernels + efficiency.moe_kernels
        )
    return roofline_s(
        flops,
        num_bytes,
        device.peak_flops(bits),
        device.mem_bytes_per_s,
        1.0,
        1.0,
        kernels,
        efficiency.kernel_launch_s,
    )


def stage_roofline_s(
    work: StageWork, device: Device, *, efficiency: Efficiency = IDEAL_EFFICIENCY, bits: int = 16
) -> tuple[float, float]:
    """(compute seconds, memory seconds) of ``work`` on ``device``, before the max (no launches)."""
    flops, num_bytes = _effective(work, efficiency, bits)
    return flops / device.peak_flops(bits), num_bytes / device.mem_bytes_per_s


def _effective(work: StageWork, eff: Efficiency, bits: int) -> tuple[float, float]:
    """FLOPs and bytes as the device would see them at full rate (divided by the efficiencies)."""
    if eff is IDEAL_EFFICIENCY:
        return work.flops, work.weight_bytes + work.kv_read_bytes + work.kv_write_bytes + work.act_bytes
    gemm = work.flops - work.attention_flops - work.routed_flops
    flops = (
        gemm / eff.gemm_compute(int(bits // 8))
        + work.attention_flops / eff.attention_compute
        + work.routed_flops / eff.moe_compute
    )
    dense_bytes = work.weight_bytes - work.routed_weight_bytes + work.act_bytes
    num_bytes = (
        dense_bytes / eff.gemm_memory
        + work.kv_bytes() / eff.attention_memory
        + work.routed_weight_bytes / eff.moe_memory
    )
    return flops, num_bytes


def _check_stage(stage: str) -> None:
    if stage not in STAGES:
        raise ConfigError("stage", stage, f"choices: {', '.join(STAGES)}")

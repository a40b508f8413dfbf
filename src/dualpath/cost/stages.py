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

from dualpath.core.errors import require
from dualpath.cost.efficiency import IDEAL_EFFICIENCY, Efficiency
from dualpath.spec.device import check_bits
from dualpath.spec.params import attention_params, expert_params, ffn_non_expert_params

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


@dataclass(frozen=True, slots=True)
class _Coefficients:
    """Per-token and per-layer element counts of one model (memoised per model)."""

    num_layers: int
    hidden: int
    a_linear_flops_per_token: float
    f_linear_flops_per_token: float
    routed_flops_per_token: float
    a_weight_elements: int
    f_weight_elements: int  # non-expert F weights
    expert_elements: int  # one routed expert of one MoE layer
    num_moe_layers: int
    num_routed: int
    num_active: int
    kv_elements: int  # per token per layer
    index_elements: int  # DSA/CSA indexer key per token (or per compressed entry)
    # layer groups: (count, window or 0, compression ratio or 0)
    groups: tuple[tuple[int, int, int], ...]
    # attention groups: (count, a representative layer) of layers that attend alike
    attention_layers: tuple[tuple[int, int], ...]
    csa: bool
    sparse_top_k: int | None


_CACHE: dict[int, tuple[ModelSpec, _Coefficients, dict[tuple[int, int], float]]] = {}
_CACHE_LIMIT = 256  # models (ablation variants included); attention entries per model below
_FLOPS_LIMIT = 1 << 16


def _entry(model: ModelSpec) -> tuple[ModelSpec, _Coefficients, dict[tuple[int, int], float]]:
    """Memo keyed by identity (a frozen spec never changes; hashing all its fields per call
    would dominate ``stage_work``), checked against the object so a reused id cannot alias."""
    entry = _CACHE.get(id(model))
    if entry is None or entry[0] is not model:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        entry = (model, _build_coefficients(model), {})
        _CACHE[id(model)] = entry
    return entry


def _coefficients(model: ModelSpec) -> _Coefficients:
    return _entry(model)[1]


def _build_coefficients(model: ModelSpec) -> _Coefficients:
    attention = attention_params(model)
    a_linear = 2.0 * attention
    f_linear = model.linear_flops_per_token - a_linear
    csa = model.attention_kind == "csa"
    counts: dict[tuple[int, int], int] = {}
    alike: dict[tuple[int | None, int], list[int]] = {}
    for layer in range(model.num_layers):
        ratio = model.compress_ratios[layer] if csa else 0
        if csa:  # every csa layer keeps the raw window plus its compressed entries
            key = (model.window_len or 0, ratio)
        else:
            key = (model.layer_window(layer) or 0, 0)
        counts[key] = counts.get(key, 0) + 1
        alike.setdefault((model.layer_window(layer), ratio), []).append(layer)
    groups = tuple((n, window, ratio) for (window, ratio), n in sorted(counts.items()))
    uniform = model.window_len is None and not csa
    attention_layers = ((model.num_layers, -1),) if uniform else tuple(
        (len(layers), layers[0]) for _, layers in sorted(alike.items(), key=lambda kv: kv[1][0]))
    return _Coefficients(
        num_layers=model.num_layers, hidden=model.hidden_size,
        a_linear_flops_per_token=a_linear, f_linear_flops_per_token=f_linear,
        routed_flops_per_token=2.0 * model.num_moe_layers * model.num_active_experts
        * expert_params(model),
        a_weight_elements=attention, f_weight_elements=ffn_non_expert_params(model),
        expert_elements=expert_params(model), num_moe_layers=model.num_moe_layers,
        num_routed=model.num_routed_experts, num_active=model.num_active_experts,
        kv_elements=model.kv_elements_per_token_layer,
        index_elements=model.index_head_dim if model.index_num_heads else 0,
        groups=groups, attention_layers=attention_layers, csa=csa,
        sparse_top_k=model.sparse_top_k,
    )


def _attention_flops(model: ModelSpec, cached_len: int, new_len: int) -> float:
    """``model.attention_flops(cached_len, new_len)`` (all layers) from one representative layer
    per group of layers that attend alike, memoised per model."""
    _, c, memo = _entry(model)
    key = (cached_len, new_len)
    flops = memo.get(key)
    if flops is None:
        if len(memo) >= _FLOPS_LIMIT:
            memo.clear()
        flops = 0.0
        for count, layer in c.attention_layers:
            flops += count * model.attention_flops_layer(cached_len, new_len,
                                                         None if layer < 0 else layer)
        memo[key] = flops
    return flops


def element_bytes(model: ModelSpec, bits: int, *, kv: bool = False) -> float:
    """Bytes per weight/activation (``kv=True``: per KV value) element at ``bits``; the
    dtype_bytes ablation (``ModelSpec.dtype_bytes_override``) replaces ``bits / 8``."""
    check_bits(bits)
    override = model.dtype_bytes_override
    if override is not None and (not kv or model.dtype_override_kv):
        return override
    return bits / 8


def _kv_entries(c: _Coefficients, context_len: int, *, read: bool) -> tuple[int, int]:
    """(KV entries, indexer keys) over all layers for one context: retained (``read=False``)
    or read by one decode query (``read=True``: DSA/CSA caps at top-k)."""
    entries = keys = 0
    cap = c.sparse_top_k if read else None
    for count, window, ratio in c.groups:
        raw = min(context_len, window) if window else context_len
        if c.csa:
            compressed = context_len // ratio if ratio else 0
            if ratio == 4:
                keys += count * compressed
                if cap is not None:
                    compressed = min(compressed, cap)
            entries += count * (raw + compressed)
            continue
        if cap is not None:
            raw = min(raw, cap)
        entries += count * raw
        if c.index_elements:
            keys += count * (min(context_len, window) if window else context_len)
    return entries, keys


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


def stage_work(model: ModelSpec, stage: Stage, *, batch: int, context_len: int,
               bits: int = 16) -> StageWork:
    """Work of one iteration of ``stage``. Prefill (pa, pf): ``batch`` prompts of ``context_len``
    new tokens each (causal, empty cache). Decode (da, df): ``batch`` sequences, each with
    ``context_len`` cached tokens and one new token."""
    _check_stage(stage)
    require(batch >= 0, "batch", batch, "must be >= 0")
    require(context_len >= 0, "context_len", context_len, "must be >= 0")
    c = _coefficients(model)
    eb = element_bytes(model, bits)
    kv_eb = element_bytes(model, bits, kv=True)
    prefill = stage in PREFILL_STAGES
    tokens = batch * context_len if prefill else batch
    act = 2.0 * tokens * c.hidden * c.num_layers * eb
    if stage in ATTENTION_STAGES:
        core = batch * (_attention_flops(model, 0, context_len) if prefill
                        else _attention_flops(model, context_len, 1))
        if prefill:
            entries, keys = _kv_entries(c, context_len, read=False)
            kv_read, kv_write = 0.0, batch * (entries * c.kv_elements + keys * c.index_elements)
        else:
            entries, keys = _kv_entries(c, context_len, read=True)
            kv_read = batch * (entries * c.kv_elements + keys * c.index_elements)
            kv_write = batch * c.num_layers * (c.kv_elements + (0 if c.csa else c.index_elements))
        return StageWork(
            flops=tokens * c.a_linear_flops_per_token + core, weight_bytes=c.a_weight_elements * eb,
            kv_read_bytes=kv_read * kv_eb, kv_write_bytes=kv_write * kv_eb, act_bytes=act,
            num_layers=c.num_layers, stage=stage, attention_flops=core)
    routed = c.num_moe_layers * touched_experts(model, tokens) * c.expert_elements * eb
    return StageWork(
        flops=tokens * c.f_linear_flops_per_token, weight_bytes=c.f_weight_elements * eb + routed,
        kv_read_bytes=0.0, kv_write_bytes=0.0, act_bytes=act, num_layers=c.num_layers,
        stage=stage, routed_flops=tokens * c.routed_flops_per_token, routed_weight_bytes=routed)


def stage_time_s(work: StageWork, device: Device, *, efficiency: Efficiency = IDEAL_EFFICIENCY,
                 bits: int = 16) -> float:
    """Roofline time of ``work`` on ``device``: ``max(flops / peak, bytes / bandwidth)`` (the
    paper's Eq. 1) with the efficiencies of ``efficiency`` (IDEAL: all 1.0, no launch term).
    Fitted efficiencies rate attention FLOPs / KV bytes, routed experts and the other GEMMs
    separately and add ``kernels x launch`` per layer."""
    compute_s, memory_s = stage_roofline_s(work, device, efficiency=efficiency, bits=bits)
    launches = efficiency.attention_kernels if work.stage in ATTENTION_STAGES else (
        efficiency.dense_kernels + efficiency.moe_kernels)
    return max(compute_s, memory_s) + work.num_layers * launches * efficiency.kernel_launch_s


def stage_roofline_s(work: StageWork, device: Device, *,
                     efficiency: Efficiency = IDEAL_EFFICIENCY, bits: int = 16) -> tuple[float, float]:
    """(compute seconds, memory seconds) of ``work`` on ``device``, before the max."""
    peak = device.peak_flops(bits)
    bandwidth = device.mem_bytes_per_s
    eff = efficiency
    if eff is IDEAL_EFFICIENCY:
        return work.flops / peak, work.total_bytes() / bandwidth
    gemm = work.flops - work.attention_flops - work.routed_flops
    compute_s = (gemm / eff.gemm_compute(int(bits // 8)) + work.attention_flops
                 / eff.attention_compute + work.routed_flops / eff.moe_compute) / peak
    dense_bytes = work.weight_bytes - work.routed_weight_bytes + work.act_bytes
    memory_s = (dense_bytes / eff.gemm_memory + work.kv_bytes() / eff.attention_memory
                + work.routed_weight_bytes / eff.moe_memory) / bandwidth
    return compute_s, memory_s


def _check_stage(stage: str) -> None:
    require(stage in STAGES, "stage", stage, f"choices: {', '.join(STAGES)}")

"""Per-model coefficients of the stage work model (cost/stages.py), memoised by model identity.

Element counts per token and per layer (A/F linear FLOPs, weights, experts, KV and indexer
elements), the groups of layers that keep / attend alike, and the two closed forms the stage model
needs per call: KV entries of a context and attention FLOPs of (cached, new) tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dualpath.spec.params import attention_params, expert_params, ffn_non_expert_params

if TYPE_CHECKING:
    from dualpath.spec.models import ModelSpec


@dataclass(frozen=True, slots=True)
class Coefficients:
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


_CACHE: dict[int, tuple[ModelSpec, Coefficients, dict[tuple[int, int], float]]] = {}
_CACHE_LIMIT = 256  # models (ablation variants included); attention entries per model below
_FLOPS_LIMIT = 1 << 16


def _entry(model: ModelSpec) -> tuple[ModelSpec, Coefficients, dict[tuple[int, int], float]]:
    """Memo keyed by identity (a frozen spec never changes; hashing all its fields per call
    would dominate ``stage_work``), checked against the object so a reused id cannot alias."""
    entry = _CACHE.get(id(model))
    if entry is None or entry[0] is not model:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        entry = (model, _build_coefficients(model), {})
        _CACHE[id(model)] = entry
    return entry


def coefficients(model: ModelSpec) -> Coefficients:
    return _entry(model)[1]


def _build_coefficients(model: ModelSpec) -> Coefficients:
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
        if not model.is_linear_layer(layer):  # a linear-attention layer keeps no KV entries
            counts[key] = counts.get(key, 0) + 1
        alike.setdefault((model.layer_window(layer), ratio), []).append(layer)
    groups = tuple((n, window, ratio) for (window, ratio), n in sorted(counts.items()))
    uniform = model.window_len is None and not csa and not model.num_linear_layers
    attention_layers = (
        ((model.num_layers, -1),)
        if uniform
        else tuple((len(layers), layers[0]) for _, layers in sorted(alike.items(), key=lambda kv: kv[1][0]))
    )
    return Coefficients(
        num_layers=model.num_layers,
        hidden=model.hidden_size,
        a_linear_flops_per_token=a_linear,
        f_linear_flops_per_token=f_linear,
        routed_flops_per_token=2.0 * model.num_moe_layers * model.num_active_experts * expert_params(model),
        a_weight_elements=attention,
        f_weight_elements=ffn_non_expert_params(model),
        expert_elements=expert_params(model),
        num_moe_layers=model.num_moe_layers,
        num_routed=model.num_routed_experts,
        num_active=model.num_active_experts,
        kv_elements=model.kv_elements_per_token_layer,
        index_elements=model.index_head_dim if model.index_num_heads else 0,
        groups=groups,
        attention_layers=attention_layers,
        csa=csa,
        sparse_top_k=model.sparse_top_k,
    )


def attention_flops(model: ModelSpec, cached_len: int, new_len: int) -> float:
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
            flops += count * model.attention_flops_layer(cached_len, new_len, None if layer < 0 else layer)
        memo[key] = flops
    return flops


def kv_entries(c: Coefficients, context_len: int, *, read: bool) -> tuple[int, int]:
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

"""What the cost models need from a ModelSpec, averaged per layer and split by parallel role.

A model is treated as ``num_layers`` identical layers (dense and MoE layers averaged, the LM head
spread over layers): per-layer times are averages, whole-model times are exact sums of the terms.
The split that matters for EP + attention DP is *replicated* work (attention, dense MLPs, shared
experts, router, embeddings: every GPU holds and runs them for its own tokens) versus *routed
experts* (each GPU of an EP group holds ``num_routed_experts / ep_size`` of them).

The replicated terms are further split for the planner's A/F stages (cost/stages.py): the
``attention_*`` part (Q/K/V/O projections, indexer, compressor) belongs to the attention side and
the ``ffn_replicated_*`` rest (dense MLP, shared experts, router, embedding + LM head) to the FFN
side; ``attention_* + ffn_replicated_* == replicated_*`` (tests/planner/test_split_unchanged.py).
The cost models keep using the replicated sums, so no cost number changed with the split.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from dualpath.core.errors import require
from dualpath.spec.model_spec import causal_kv_sum
from dualpath.spec.params import attention_params

if TYPE_CHECKING:
    from dualpath.spec.models import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """Per-layer averages of one model (whole model, before any parallel split)."""

    num_layers: int
    hidden_size: int
    weight_dtype_bytes: float
    kv_bytes_per_token_layer: float  # mean over layers (windowed layers count fully)
    indexer_bytes_per_token_layer: float  # DSA indexer keys read by every decode query
    sparse_top_k: int | None
    replicated_flops_per_token_layer: float  # dense/shared/attention projections + LM head
    routed_flops_per_token_layer: float  # active routed experts
    replicated_weight_bytes_layer: float
    expert_weight_bytes: float  # one routed expert of one MoE layer
    num_routed_experts: int
    num_active_experts: int
    moe_layer_fraction: float  # MoE layers / all layers
    # the attention-side share of the replicated terms (A stages); the rest is the FFN side
    attention_linear_flops_per_token_layer: float
    attention_weight_bytes_layer: float

    @property
    def is_moe(self) -> bool:
        return self.num_routed_experts > 0

    @property
    def ffn_replicated_flops_per_token_layer(self) -> float:
        """Dense MLP, shared experts, router and LM head FLOPs (the F side of the replicated)."""
        return self.replicated_flops_per_token_layer - self.attention_linear_flops_per_token_layer

    @property
    def ffn_replicated_weight_bytes_layer(self) -> float:
        return self.replicated_weight_bytes_layer - self.attention_weight_bytes_layer


@lru_cache(maxsize=64)
def model_shape(model: ModelSpec) -> ModelShape:
    """Derive (and memoise) the per-layer cost shape of ``model``."""
    num_layers = model.num_layers
    expert_params = 3 * model.hidden_size * model.moe_intermediate_size if model.is_moe else 0
    routed_active = model.num_moe_layers * model.num_active_experts * expert_params
    routed_total = model.num_moe_layers * model.num_routed_experts * expert_params
    replicated_flops = model.linear_flops_per_token - 2.0 * routed_active
    replicated_weights = max(model.weight_bytes - routed_total * model.weight_dtype_bytes, 0.0)
    # DSA indexer keys (FP8 + scale) are read by every query; csa models fold theirs into the spec
    has_indexer = model.attention_kind != "csa" and model.index_num_heads > 0
    indexer = float(model.index_kv_bytes_per_token_layer) if has_indexer else 0.0
    attention = attention_params(model)
    return ModelShape(
        num_layers=num_layers,
        hidden_size=model.hidden_size,
        weight_dtype_bytes=model.weight_dtype_bytes,
        kv_bytes_per_token_layer=float(model.kv_bytes_per_token_layer),
        indexer_bytes_per_token_layer=indexer,
        sparse_top_k=model.sparse_top_k,
        replicated_flops_per_token_layer=replicated_flops / num_layers,
        routed_flops_per_token_layer=2.0 * routed_active / num_layers,
        replicated_weight_bytes_layer=replicated_weights / num_layers,
        expert_weight_bytes=expert_params * model.weight_dtype_bytes,
        num_routed_experts=model.num_routed_experts,
        num_active_experts=model.num_active_experts,
        moe_layer_fraction=model.num_moe_layers / num_layers,
        attention_linear_flops_per_token_layer=2.0 * attention / num_layers,
        attention_weight_bytes_layer=attention * model.weight_dtype_bytes / num_layers,
    )


def is_uniform(model: ModelSpec) -> bool:
    """Every layer attends alike (no sliding windows, no per-layer compression, no linear-attention
    layers)."""
    return model.window_len is None and model.attention_kind != "csa" and not model.num_linear_layers


def attention_flops_layer(model: ModelSpec, cached_len: int, new_len: int) -> float:
    """Mean per-layer attention FLOPs (windowed / compressed layers averaged in)."""
    if is_uniform(model):
        return model.attention_flops_layer(cached_len, new_len)
    return model.attention_flops(cached_len, new_len) / model.num_layers


def kv_layer_bytes(model: ModelSpec, num_tokens: int) -> float:
    """Mean per-layer KV bytes of ``num_tokens`` tokens (windows and compression respected)."""
    if is_uniform(model):
        return float(num_tokens * model.kv_bytes_per_token_layer)
    return model.kv_bytes(num_tokens) / model.num_layers


def attention_flops_split(model: ModelSpec, cached_len: int, new_len: int) -> tuple[float, float]:
    """(main attention, DSA indexer) FLOPs of one average layer; they sum to the spec's count."""
    total = attention_flops_layer(model, cached_len, new_len)
    if not model.index_num_heads or model.attention_kind == "csa":
        return total, 0.0  # csa: the spec folds its compressed-entry indexer into the total
    indexer = causal_kv_sum(cached_len, new_len, model.window_len) * model.indexer_flops_per_pair
    return total - indexer, float(indexer)


def decode_attention_flops(model: ModelSpec, context_lens: Sequence[int]) -> tuple[float, float]:
    """(main, indexer) FLOPs of one average layer when each context gets one new token."""
    if not is_uniform(model):
        main = indexer = 0.0
        for length in context_lens:
            m, i = attention_flops_split(model, length, 1)
            main, indexer = main + m, indexer + i
        return main, indexer
    keys = sum(context_lens) + len(context_lens)  # each new token sees its context and itself
    cap = model.sparse_top_k
    capped = keys if cap is None else sum(min(c + 1, cap) for c in context_lens)
    indexer = keys * model.indexer_flops_per_pair if model.index_num_heads else 0.0
    return capped * model.attention_flops_per_pair, float(indexer)


def local_experts(shape: ModelShape, ep_size: int) -> float:
    """Routed experts one GPU of an EP group of ``ep_size`` holds."""
    return shape.num_routed_experts / ep_size if shape.is_moe else 0.0


def touched_local_experts(shape: ModelShape, ep_size: int, group_tokens: float) -> float:
    """Expected distinct local experts hit when the EP group routes ``group_tokens`` tokens.

    Uniform routing: an expert is missed by one token with probability ``1 - k/E``, so it is hit by
    at least one of ``T`` tokens with probability ``1 - (1 - k/E)^T``.
    """
    if not shape.is_moe or group_tokens <= 0:
        return 0.0
    miss = 1.0 - shape.num_active_experts / shape.num_routed_experts
    hit = 1.0 - math.exp(group_tokens * math.log(miss)) if miss > 0 else 1.0
    return local_experts(shape, ep_size) * hit


def weight_bytes_per_gpu(model: ModelSpec, ep_size: int = 1) -> float:
    """HBM bytes of weights one GPU holds: all replicated weights + its share of routed experts."""
    require(ep_size >= 1, "ep_size", ep_size, "must be >= 1")
    shape = model_shape(model)
    experts = local_experts(shape, ep_size) * shape.expert_weight_bytes
    return shape.num_layers * (shape.replicated_weight_bytes_layer + shape.moe_layer_fraction * experts)

"""Roofline cost model: every operation takes the slower of its compute and its HBM traffic.

Per (average) layer on one GPU:

- attention: FLOPs from the spec (absorbed MLA / GQA, DSA cap and indexer included); bytes = the
  KV the batch reads (prefill: whole cached context + new tokens; decode: DSA reads its top-k
  tokens plus every indexer key, dense attention reads the whole context) and the new KV written;
- dense ("replicated") linears: this GPU's tokens x replicated FLOPs per token; bytes = the
  replicated weights of the layer (attention projections, dense MLP or shared experts, router);
- routed experts (EP): this GPU computes ``group_tokens x top_k / ep_size`` token-expert pairs
  and reads the weights of the local experts those pairs touch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dualpath.core.errors import require
from dualpath.cost.base import CostConfig, Item, check_contexts, check_group, check_items
from dualpath.cost.efficiency import roofline_s
from dualpath.cost.shapes import (
    attention_flops_split,
    decode_attention_flops,
    kv_layer_bytes,
    model_shape,
    touched_local_experts,
)

if TYPE_CHECKING:
    from dualpath.cost.predictor import FittedAttentionPredictor
    from dualpath.spec.device import Device
    from dualpath.spec.models import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class RooflineCostModel:
    """Roofline per operation with the efficiencies of ``config.efficiency`` (see efficiency.py).

    ``gpu`` is any ``spec.device.Device`` (a ``GPUSpec`` or a planner NPU ``DeviceSpec``)."""

    gpu: Device
    config: CostConfig = field(default_factory=CostConfig)
    name: str = "roofline"

    def __post_init__(self) -> None:
        require(
            self.gpu.mem_bytes_per_s > 0, "gpu.mem_bytes_per_s", self.gpu.mem_bytes_per_s, "must be positive"
        )

    # ---- hardware ---------------------------------------------------------------------------
    @property
    def hbm_bytes_per_s(self) -> float:
        return self.gpu.mem_bytes_per_s

    def peak_flops(self, dtype_bytes: float) -> float:
        """Dense tensor-core peak for operands of ``dtype_bytes`` (<= 1: FP8, else BF16)."""
        # peak_flops falls back to a wider dtype where the GPU lacks one (FP8 on A100)
        return self.gpu.peak_flops(8 if dtype_bytes <= 1 else 16)

    # ---- operations (one average layer, this GPU) ------------------------------------------
    def attention_op_s(self, main_flops: float, indexer_flops: float, num_bytes: float) -> float:
        """Attention of one layer: main attention at the BF16 rate, the DSA indexer (FP8 keys and
        queries) at the FP8 rate; ``num_bytes`` = KV read + indexer keys read + new KV written."""
        eff = self.config.efficiency
        bf16_peak = self.peak_flops(2)
        flops = main_flops + indexer_flops * bf16_peak / self.peak_flops(1)  # BF16-equivalent
        return roofline_s(
            flops,
            num_bytes,
            bf16_peak,
            self.hbm_bytes_per_s,
            eff.attention_compute,
            eff.attention_memory,
            eff.attention_kernels,
            eff.kernel_launch_s,
        )

    def dense_op_s(self, model: ModelSpec, num_tokens: float) -> float:
        shape = model_shape(model)
        eff = self.config.efficiency
        return roofline_s(
            num_tokens * shape.replicated_flops_per_token_layer,
            shape.replicated_weight_bytes_layer,
            self.peak_flops(shape.weight_dtype_bytes),
            self.hbm_bytes_per_s,
            eff.gemm_compute(int(shape.weight_dtype_bytes)),
            eff.gemm_memory,
            eff.dense_kernels,
            eff.kernel_launch_s,
        )

    def moe_op_s(self, model: ModelSpec, group_tokens: float) -> float:
        """Routed experts of one average layer on this GPU when the group routes ``group_tokens``."""
        shape = model_shape(model)
        if not shape.is_moe:
            return 0.0
        eff = self.config.efficiency
        ep = self.config.ep_size
        flops = group_tokens / ep * shape.routed_flops_per_token_layer
        touched = touched_local_experts(shape, ep, group_tokens)
        num_bytes = shape.moe_layer_fraction * touched * shape.expert_weight_bytes
        # flops and bytes are averages over all layers (MoE layers x fraction); so are launches
        launches_s = shape.moe_layer_fraction * eff.moe_kernels * eff.kernel_launch_s
        return (
            roofline_s(
                flops,
                num_bytes,
                self.peak_flops(shape.weight_dtype_bytes),
                self.hbm_bytes_per_s,
                eff.moe_compute,
                eff.moe_memory,
                0,
                0.0,
            )
            + launches_s
        )

    # ---- prefill ----------------------------------------------------------------------------
    def prefill_attention_layer_s(self, model: ModelSpec, items: Sequence[Item]) -> float:
        """Reads every cached token's KV (and indexer key) once, writes the new tokens' KV."""
        index_bytes = model_shape(model).indexer_bytes_per_token_layer
        main = indexer = num_bytes = 0.0
        for cached_len, new_len in items:
            item_main, item_indexer = attention_flops_split(model, cached_len, new_len)
            main += item_main
            indexer += item_indexer
            num_bytes += kv_layer_bytes(model, cached_len + new_len)
            num_bytes += (cached_len + new_len) * index_bytes
        return self.attention_op_s(main, indexer, num_bytes)

    def prefill_layer_times_s(
        self, model: ModelSpec, items: Sequence[Item], *, group_num_tokens: int | None = None
    ) -> tuple[float, float]:
        check_items(items)
        num_tokens = sum(new_len for _, new_len in items)
        group = check_group(group_num_tokens, num_tokens, self.config.ep_size, "group_num_tokens")
        attention_s = self.prefill_attention_layer_s(model, items)
        other_s = self.dense_op_s(model, num_tokens) + self.moe_op_s(model, group)
        return attention_s, other_s

    def prefill_iteration_time_s(
        self, model: ModelSpec, items: Sequence[Item], *, group_num_tokens: int | None = None
    ) -> float:
        attention_s, other_s = self.prefill_layer_times_s(model, items, group_num_tokens=group_num_tokens)
        return model.num_layers * (attention_s + other_s)

    # ---- decode -----------------------------------------------------------------------------
    def decode_attention_layer_s(self, model: ModelSpec, context_lens: Sequence[int]) -> float:
        """Reads each context's KV (DSA: only its top-k tokens, plus every indexer key)."""
        shape = model_shape(model)
        cap = shape.sparse_top_k
        main, indexer = decode_attention_flops(model, context_lens)
        if cap is None:
            num_bytes = sum(kv_layer_bytes(model, c) for c in context_lens)
        else:
            num_bytes = sum(kv_layer_bytes(model, min(c, cap)) for c in context_lens)
        num_bytes += len(context_lens) * shape.kv_bytes_per_token_layer  # the new tokens' KV
        num_bytes += sum(context_lens) * shape.indexer_bytes_per_token_layer
        return self.attention_op_s(main, indexer, num_bytes)

    def decode_layer_times_s(
        self, model: ModelSpec, context_lens: Sequence[int], *, group_batch_size: int | None = None
    ) -> tuple[float, float]:
        check_contexts(context_lens)
        batch = len(context_lens)
        group = check_group(group_batch_size, batch, self.config.ep_size, "group_batch_size")
        attention_s = self.decode_attention_layer_s(model, context_lens)
        return attention_s, self.dense_op_s(model, batch) + self.moe_op_s(model, group)

    def decode_step_time_s(
        self, model: ModelSpec, context_lens: Sequence[int], *, group_batch_size: int | None = None
    ) -> float:
        attention_s, other_s = self.decode_layer_times_s(
            model, context_lens, group_batch_size=group_batch_size
        )
        return model.num_layers * (attention_s + other_s)

    # ---- policy seam and description ----------------------------------------------------------
    def attention_predictor(self, model: ModelSpec) -> FittedAttentionPredictor:
        from dualpath.cost.predictor import fit_attention_predictor

        return fit_attention_predictor(self, model)

    def describe(self) -> dict[str, object]:
        from dataclasses import asdict

        return {
            "name": self.name,
            "gpu": self.gpu.name,
            "ep_size": self.config.ep_size,
            "efficiency": asdict(self.config.efficiency),
        }

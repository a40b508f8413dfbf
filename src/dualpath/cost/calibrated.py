"""Calibrated cost model: measured H100/H200 kernel latencies where a table covers the shape,
the roofline (with the reason recorded) where none does.

Op -> table (aiconfigurator perf-db, TensorRT-LLM kernels), per (average) layer on one GPU:

- replicated linears -> ``gemm_perf`` at ``n = k = hidden``: the layer's replicated weights are
  ``P`` parameters, i.e. ``P / hidden^2`` equivalent square GEMMs of ``m`` = this GPU's tokens;
- routed experts -> ``moe_perf`` (balanced routing, moe_tp 1) at ``num_tokens`` = the EP group's
  tokens (the collector feeds all tokens to one rank that owns experts/ep of them); an EP size
  missing from the table uses the nearest smaller one at equal tokens per GPU;
- decode attention -> ``generation_mla_perf`` / ``generation_attention_perf`` at (batch, mean KV
  length); DSA reads its top-k tokens, and its indexer is added by roofline;
- prefill attention, DSA -> ``generation_mla_perf`` with batch = new tokens and KV length = mean keys
  per query (sparse MQA over the gathered top-k is the decode kernel's shape) + indexer by roofline;
  dense MLA / GQA -> ``context_mla_perf`` / ``context_attention_perf`` at the no-cache prompt length
  with the same (query, key) pairs per request.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dualpath.cost.base import CostConfig, Item
from dualpath.cost.roofline import RooflineCostModel
from dualpath.cost.shapes import (
    attention_flops_split,
    decode_attention_flops,
    is_uniform,
    model_shape,
)
from dualpath.cost.tables import (
    PerfTables,
    Surface,
    curve_from_rows,
    open_tables,
    select,
)
from dualpath.spec.model_spec import causal_kv_sum

if TYPE_CHECKING:
    from dualpath.spec.hardware import GPUSpec
    from dualpath.spec.models import ModelSpec

Lookup = Any  # Curve | Surface | tuple | None, per op


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibratedCostModel(RooflineCostModel):
    """Table-driven per-op times; ``notes`` records per (model, op) which table or why roofline."""

    tables: PerfTables
    name: str = "calibrated"
    notes: dict[str, str] = field(default_factory=dict)
    _lookups: dict[tuple[str, str], Lookup] = field(default_factory=dict)

    @classmethod
    def load(
        cls, *, gpu: GPUSpec, config: CostConfig, data_dir: str | Path | None = None
    ) -> CalibratedCostModel:
        """Open ``gpu``'s tables (lazily read): the data folder's, else the bundled ones
        (cost/tables.py ``open_tables``); ConfigError naming the path if neither has them."""
        return cls(gpu=gpu, config=config, tables=open_tables(f"{gpu.name}_sxm", data_dir))

    # ---- table bindings (built once per model and op) ---------------------------------------
    def _lookup(self, model: ModelSpec, op: str) -> Lookup:
        key = (model.name, op)
        if key not in self._lookups:
            found, note = getattr(self, f"_bind_{op}")(model)
            self._lookups[key] = found
            self.notes[f"{model.name}/{op}"] = note if found is not None else f"roofline: {note}"
        return self._lookups[key]

    def _bind_dense(self, model: ModelSpec) -> tuple[Lookup, str]:
        dtype = "fp8_block" if model.weight_dtype_bytes == 1 else "bfloat16"
        if model.weight_dtype_bytes not in (1, 2):
            return None, f"mixed weight dtype ({model.weight_dtype_bytes} B/param)"
        h = model.hidden_size
        rows = select(self.tables.frame("gemm", "gemm_perf"), gemm_dtype=dtype, n=h, k=h)
        if rows is None:
            return None, f"no {dtype} gemm rows with n = k = hidden = {h}"
        shape = model_shape(model)
        factor = shape.replicated_weight_bytes_layer / model.weight_dtype_bytes / (h * h)
        return (curve_from_rows(rows, "m"), factor), f"gemm_perf {dtype} n=k={h} x {factor:.2f}"

    def _bind_moe(self, model: ModelSpec) -> tuple[Lookup, str]:
        if not model.is_moe:
            return None, "dense model"
        frame = select(
            self.tables.frame("moe", "moe_perf"),
            hidden_size=model.hidden_size,
            inter_size=model.moe_intermediate_size,
            topk=model.num_active_experts,
            num_experts=model.num_routed_experts,
            moe_tp_size=1,
            distribution="balanced",
        )
        if frame is None:
            return None, "no moe_perf rows for this expert shape"
        dtypes = {1: ("fp8_block", "fp8"), 2: ("bfloat16",)}.get(
            int(model.weight_dtype_bytes), ("w4a16_mxfp4",)
        )
        dtype = next((d for d in dtypes if (frame["moe_dtype"] == d).any()), None)
        if dtype is None:
            return None, f"moe_perf has no {'/'.join(dtypes)} rows for this shape"
        rows = frame[frame["moe_dtype"] == dtype]
        ep = self.config.ep_size
        eps = sorted(int(e) for e in set(rows["moe_ep_size"].tolist()))
        ep_table = max((e for e in eps if e <= ep), default=eps[0])
        curve = curve_from_rows(rows[rows["moe_ep_size"] == ep_table], "num_tokens")
        note = f"moe_perf {dtype} ep={ep_table}" + ("" if ep_table == ep else f" scaled to ep={ep}")
        return (curve, ep_table / ep), note

    def _attention_rows(self, model: ModelSpec, phase: str) -> tuple[Any, str]:
        """``(rows, table)`` of the ``phase`` ("generation" | "context") attention table that
        matches ``model``; ``(None, reason)`` when no table covers it."""
        if not is_uniform(model):
            return None, "windowed or compressed (csa) attention layers are not in the tables"
        kv = "fp8" if model.kv_dtype_bytes <= 1 else "bfloat16"
        if model.attention_kind == "mla":
            table = f"{phase}_mla_perf"
            rows = select(
                self.tables.frame("mla", table), num_heads=model.num_heads, tp_size=1, kv_cache_dtype=kv
            )
        else:
            table = f"{phase}_attention_perf"
            rows = select(
                self.tables.frame("attention", table),
                num_heads=model.num_heads,
                num_key_value_heads=model.num_kv_heads,
                head_dim=model.head_dim,
                window_size=0,
                attn_dtype="bfloat16",
                kv_cache_dtype=kv,
            )
        if rows is None:
            return None, f"no {table} rows for {model.num_heads} heads"
        return rows, table

    def _bind_decode_attn(self, model: ModelSpec) -> tuple[Lookup, str]:
        rows, table = self._attention_rows(model, "generation")
        if rows is None:
            return None, table
        return Surface.from_rows(rows, "batch_size", "step"), f"{table} (batch, kv_len)"

    def _bind_prefill_attn(self, model: ModelSpec) -> tuple[Lookup, str]:
        if model.attention_kind == "mla" and model.sparse_top_k is not None:
            found, note = self._bind_decode_attn(model)
            return (("sparse", found) if found is not None else None), f"{note}, sparse MQA"
        rows, table = self._attention_rows(model, "context")
        if rows is None:
            return None, table
        return ("pairs", Surface.from_rows(rows, "batch_size", "isl")), f"{table} at equal pairs"

    # ---- ops ----------------------------------------------------------------------------------
    def dense_op_s(self, model: ModelSpec, num_tokens: float) -> float:
        found = self._lookup(model, "dense")
        if found is None:
            return RooflineCostModel.dense_op_s(self, model, num_tokens)
        curve, factor = found
        return float(curve(num_tokens)) * factor

    def moe_op_s(self, model: ModelSpec, group_tokens: float) -> float:
        found = self._lookup(model, "moe")
        if found is None:
            return RooflineCostModel.moe_op_s(self, model, group_tokens)
        curve, token_scale = found
        return float(curve(group_tokens * token_scale)) * model_shape(model).moe_layer_fraction

    def _indexer_s(self, model: ModelSpec, indexer_flops: float, keys_read: float) -> float:
        key_bytes = keys_read * model_shape(model).indexer_bytes_per_token_layer
        return self.attention_op_s(0.0, indexer_flops, key_bytes) if key_bytes else 0.0

    def prefill_attention_layer_s(self, model: ModelSpec, items: Sequence[Item]) -> float:
        found = self._lookup(model, "prefill_attn")
        if found is None:
            return RooflineCostModel.prefill_attention_layer_s(self, model, items)
        kind, surface = found
        cap = model.sparse_top_k
        pairs = sum(causal_kv_sum(c, n, cap) for c, n in items)
        queries = sum(n for _, n in items)
        if kind == "sparse":
            indexer = sum(attention_flops_split(model, c, n)[1] for c, n in items)
            keys = float(sum(c + n for c, n in items))
            return surface(queries, pairs / queries) + self._indexer_s(model, indexer, keys)
        num = len(items)
        per_request = pairs / num
        isl = (math.sqrt(8.0 * per_request + 1.0) - 1.0) / 2.0  # isl (isl + 1) / 2 = pairs
        return float(surface(num, isl))

    def decode_attention_layer_s(self, model: ModelSpec, context_lens: Sequence[int]) -> float:
        surface = self._lookup(model, "decode_attn")
        if surface is None:
            return RooflineCostModel.decode_attention_layer_s(self, model, context_lens)
        cap = model.sparse_top_k
        batch = len(context_lens)
        kv_mean = sum(c if cap is None else min(c, cap) for c in context_lens) / batch
        time_s = float(surface(batch, kv_mean))
        if model_shape(model).indexer_bytes_per_token_layer:
            indexer = decode_attention_flops(model, context_lens)[1]
            time_s += self._indexer_s(model, indexer, float(sum(context_lens)))
        return time_s

    def describe(self) -> dict[str, object]:
        info = RooflineCostModel.describe(self)
        info["tables"] = self.tables.origin
        info["coverage"] = dict(sorted(self.notes.items()))
        return info

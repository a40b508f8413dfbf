"""DeepSeek-V4 hybrid attention ("csa" kind): per-layer KV compression with a sliding window.

Each layer keeps the last ``window`` raw KV entries plus compressed entries, one per ``ratio`` tokens
(``compress_ratios[layer]``: 4 = CSA, compressed sparse attention, whose indexer picks ``sparse_top_k``
compressed entries per query; 128 = HCA, heavily compressed, attends to all of them; 0 = window only).
One KV head whose entry serves as key and value (head_dim 512, 64 of them rope): one entry is
``kv_bytes_per_token_layer_override`` bytes (576: 448 FP8 + 64 BF16). The CSA indexer scores every
compressed entry with ``index_num_heads x index_head_dim``.

Counting is exact for causal queries at positions cached+1 .. cached+new (closed forms, no loops over
tokens). Pure functions of a model's shape (spec/model_shape.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dualpath.spec.causal import causal_kv_sum

if TYPE_CHECKING:
    from dualpath.spec.model_shape import ModelShape

CSA_RATIO = 4


def _floor_sum(n: int, r: int) -> int:
    """sum_{p=1..n} floor(p / r)."""
    if n <= 0:
        return 0
    q, rem = divmod(n, r)
    return r * q * (q - 1) // 2 + q * (rem + 1)


def _compressed_sum(c: int, n: int, r: int, cap: int | None) -> int:
    """sum_{p=c+1..c+n} min(floor(p/r), cap)."""
    lo, hi = c, c + n
    if cap is None:
        return _floor_sum(hi, r) - _floor_sum(lo, r)
    knee = cap * r  # floor(p/r) >= cap from here on
    below_hi = min(hi, knee - 1)
    total = _floor_sum(below_hi, r) - _floor_sum(lo, r) if below_hi > lo else 0
    above = hi - max(lo, below_hi)
    return total + max(0, above) * cap


def layer_entries(m: ModelShape, layer: int, context_len: int) -> int:
    """KV entries one layer keeps for a context of ``context_len`` tokens."""
    ratio = m.compress_ratios[layer]
    window = min(context_len, m.window_len or 0)
    return window + (context_len // ratio if ratio else 0)


def kv_bytes(m: ModelShape, context_len: int) -> float:
    entries = sum(layer_entries(m, i, context_len) for i in range(m.num_layers))
    return float(entries * m.kv_bytes_per_token_layer)


def kv_bytes_per_token(m: ModelShape) -> int:
    """Long-context marginal bytes per token over all layers (window excluded), rounded up."""
    per_token = sum(1 / r for r in m.compress_ratios if r) * m.kv_bytes_per_token_layer
    return int(-(-per_token // 1))


def attention_flops_layer(m: ModelShape, cached_len: int, new_len: int, layer: int) -> float:
    ratio = m.compress_ratios[layer]
    pairs = causal_kv_sum(cached_len, new_len, m.window_len or 0)  # the window
    flops = 0.0
    if ratio:
        cap = m.sparse_top_k if ratio == CSA_RATIO else None
        pairs += _compressed_sum(cached_len, new_len, ratio, cap)
        if ratio == CSA_RATIO and m.index_num_heads:
            scored = _compressed_sum(cached_len, new_len, ratio, None)
            flops += scored * m.indexer_flops_per_pair
    return flops + pairs * m.attention_flops_per_pair


def attention_params_layer(m: ModelShape, layer: int) -> int:
    """Q (LoRA), shared KV, grouped low-rank output, compressor and (CSA) indexer projections."""
    d, h, hd = m.hidden_size, m.num_heads, m.head_dim
    q_lora = m.q_lora_rank or d
    params = d * q_lora + q_lora * h * hd + d * hd  # wq_a, wq_b, wkv
    params += h * hd * m.o_lora_rank + m.o_groups * m.o_lora_rank * d  # wo_a, wo_b
    ratio = m.compress_ratios[layer]
    overlap = 2 if ratio == CSA_RATIO else 1  # CSA compresses overlapping windows
    if ratio:
        params += 2 * d * overlap * hd  # compressor kv + gate
    if ratio == CSA_RATIO and m.index_num_heads:
        ih, ihd = m.index_num_heads, m.index_head_dim
        params += q_lora * ih * ihd + 2 * d * overlap * ihd + d * ih
    return params

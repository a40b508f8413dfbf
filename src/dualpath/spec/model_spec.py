"""ModelSpec: the shape of one transformer and what follows from it (KV bytes, FLOPs, weight bytes).

The fields, their checks and the per-layer terms are spec/model_shape.py's ``ModelShape``; this
class adds the totals over layers and lengths (which spec/params.py and spec/compressed.py give).

Pure arithmetic over a frozen table entry; no I/O. FLOPs count a multiply-add as 2. Conventions:

- KV bytes per token per layer: MLA stores one latent of ``kv_lora_rank + qk_rope_head_dim`` values,
  GQA/MHA store K and V for every KV head; ``kv_bytes_per_token_layer_override`` carries layouts with
  scales (DeepSeek FlashMLA FP8: 512 FP8 + 16 B scales + 64 BF16 rope = 656 B).
- Attention FLOPs per (query, key) pair and layer: GQA/MHA ``4 x heads x head_dim`` (QK^T and PV);
  absorbed MLA ``2 x heads x (kv_lora + rope) + 2 x heads x kv_lora``. A query at position ``p`` sees
  ``p`` keys, capped by DSA's ``sparse_top_k`` or by a sliding/chunked window; the DSA indexer scores
  every key (``2 x index_heads x index_head_dim`` per pair), uncapped.
- Linear FLOPs per token: ``2 x`` the active non-embedding parameters (from the shapes) plus the LM head.
"""

from __future__ import annotations

from dataclasses import dataclass

import dualpath.spec.compressed as compressed
from dualpath.core.errors import require
from dualpath.spec.causal import causal_kv_sum
from dualpath.spec.model_shape import ATTENTION_KINDS, AttentionKind, ModelShape
from dualpath.spec.params import active_non_embedding_params

__all__ = ["ATTENTION_KINDS", "AttentionKind", "ModelShape", "ModelSpec", "causal_kv_sum"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec(ModelShape):
    """One model's shape. Published totals are recorded; everything else is derived from shapes."""

    # ---- KV term ---------------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        """All layers, as if every layer kept every token (windowed layers included).
        csa: the long-context marginal bytes per token (compressed entries, window excluded)."""
        if self.attention_kind == "csa":
            return compressed.kv_bytes_per_token(self)
        return self.kv_bytes_per_token_layer * self.num_layers

    @property
    def cache_bytes_per_token(self) -> int:
        """Everything a cached token keeps, all layers: attention KV plus the DSA indexer keys
        (csa: indexer keys exist per compressed entry of the CSA layers only)."""
        if self.attention_kind == "csa":
            csa_layers = sum(r == 4 for r in self.compress_ratios)
            return self.kv_bytes_per_token + -(-csa_layers * self.index_kv_bytes_per_token_layer // 4)
        return (self.kv_bytes_per_token_layer + self.index_kv_bytes_per_token_layer) * self.num_layers

    def kv_bytes(self, context_len: int) -> float:
        """KV bytes a context of ``context_len`` tokens needs; windowed layers keep only the window."""
        require(context_len >= 0, "context_len", context_len, "must be >= 0")
        if self.attention_kind == "csa":
            return compressed.kv_bytes(self, context_len)
        tokens = sum(
            min(context_len, w) if (w := self.layer_window(i)) is not None else context_len
            for i in range(self.num_layers)
        )
        return float(tokens * self.kv_bytes_per_token_layer)

    # ---- FLOPs -----------------------------------------------------------------------------
    @property
    def linear_flops_per_token(self) -> float:
        return 2.0 * (active_non_embedding_params(self) + self.vocab_size * self.hidden_size)

    def attention_flops_layer(self, cached_len: int, new_len: int, layer: int | None = None) -> float:
        """Attention FLOPs of ``new_len`` causal queries after ``cached_len`` cached tokens in one
        layer (``layer=None``: a full-attention layer). DSA caps keys at ``sparse_top_k``."""
        require(cached_len >= 0, "cached_len", cached_len, "must be >= 0")
        require(new_len >= 0, "new_len", new_len, "must be >= 0")
        if self.attention_kind == "csa":
            return compressed.attention_flops_layer(self, cached_len, new_len, self._csa_layer(layer))
        window = None if layer is None else self.layer_window(layer)
        caps = [c for c in (window, self.sparse_top_k) if c is not None]
        pairs = causal_kv_sum(cached_len, new_len, min(caps) if caps else None)
        flops = pairs * self.attention_flops_per_pair
        if self.index_num_heads:
            flops += causal_kv_sum(cached_len, new_len, window) * self.indexer_flops_per_pair
        return float(flops)

    def attention_flops(self, cached_len: int, new_len: int) -> float:
        """Attention FLOPs over all layers."""
        if self.window_len is None and self.attention_kind != "csa" and not self.linear_num_value_heads:
            return self.num_layers * self.attention_flops_layer(cached_len, new_len)
        return sum(self.attention_flops_layer(cached_len, new_len, i) for i in range(self.num_layers))

    def _csa_layer(self, layer: int | None) -> int:
        """``layer=None`` for csa: the first CSA layer (the typical long-context layer)."""
        if layer is not None:
            return layer
        return next((i for i, r in enumerate(self.compress_ratios) if r == 4), 0)

    def prefill_flops(self, cached_len: int, new_len: int) -> float:
        """Linear + attention FLOPs of prefilling ``new_len`` tokens on top of ``cached_len``."""
        return new_len * self.linear_flops_per_token + self.attention_flops(cached_len, new_len)

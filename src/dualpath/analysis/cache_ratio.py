"""Cache-compute ratio: GB of cached KV to load per PFLOP of prefill compute (spec section 1).

ratio = context x KV bytes per token / (linear FLOPs x append + attention FLOPs), where the prompt is
``context`` tokens of which the last ``append`` are new (cached = context - append). KV counts the
attention cache only (DeepSeek: the 656 B FlashMLA FP8 layout, without the DSA indexer's key cache),
as the paper's Table 1 does; windowed layers count their window only.
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.core.errors import require
from dualpath.core.units import GB, PFLOP
from dualpath.spec.models import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheRatio:
    context_len: int
    append_len: int
    kv_gb: float
    prefill_pflop: float
    gb_per_pflop: float


def cache_compute_ratio(model: ModelSpec, append_len: int, context_len: int) -> CacheRatio:
    """Ratio for one (append, context) point; ``context_len`` includes the appended tokens."""
    require(append_len > 0, "append_len", append_len, "must be positive")
    require(context_len >= append_len, "context_len", context_len, f"must be >= append_len={append_len}")
    kv_gb = model.kv_bytes(context_len) / GB
    pflop = model.prefill_flops(context_len - append_len, append_len) / PFLOP
    return CacheRatio(
        context_len=context_len,
        append_len=append_len,
        kv_gb=kv_gb,
        prefill_pflop=pflop,
        gb_per_pflop=kv_gb / pflop,
    )


def cache_compute_ratios(model: ModelSpec, append_len: int, context_lens: list[int]) -> list[CacheRatio]:
    return [cache_compute_ratio(model, append_len, c) for c in context_lens]

"""The causal key count behind every attention FLOPs count (spec, cost, policy)."""

from __future__ import annotations


def causal_kv_sum(cached_len: int, new_len: int, kv_cap: int | None = None) -> int:
    """Sum over the ``new_len`` new queries of the keys each attends to: ``cached_len + i`` for the
    i-th new token (i = 1..new_len), each capped at ``kv_cap`` (sparse top-k or a sliding window)
    when given. The one closed form every FLOPs count (spec, cost, policy) uses."""
    n, c = new_len, cached_len
    if n <= 0:
        return 0
    if kv_cap is None:
        return n * c + n * (n + 1) // 2
    m = max(0, min(kv_cap - c, n))  # queries still under the cap
    return m * c + m * (m + 1) // 2 + (n - m) * kv_cap

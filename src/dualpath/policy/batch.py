"""PE batch formation (spec section 8): compute-quota FIFO packing with chunked prefill, or a
plain FIFO token budget for the baselines.

Invariants (property-tested): the batch is a FIFO prefix of ``waiting``; only its last entry may be
chunked; its predicted attention time is <= the quota, except that a lone first request always
gets at least one token (so a PE never stalls on a request too large for the quota).
"""

from __future__ import annotations

from dualpath.core.errors import ConfigError, DualpathError
from dualpath.policy.config import SchedulerConfig
from dualpath.policy.predictor import AttentionTimePredictor
from dualpath.policy.views import BatchEntry, BatchItem, BatchPlan, BatchView


def plan_batch(view: BatchView, config: SchedulerConfig, mode: str) -> BatchPlan:
    """Dispatch on ``mode`` ("quota" or "tokens")."""
    for item in view.waiting:
        if item.new_len <= 0 or item.cached_len < 0:
            raise DualpathError(
                f"waiting item {item.request_id!r}: new_len={item.new_len!r} must be > 0 and "
                f"cached_len={item.cached_len!r} >= 0"
            )
    if mode == "quota":
        pred = config.attention_predictor
        if pred is None:
            raise ConfigError("attention_predictor", None, "compute-quota batching needs one")
        return quota_batch(view.waiting, pred, config.compute_quota_s)
    if mode == "tokens":
        return token_batch(view.waiting, config.max_batch_tokens, config.attention_predictor)
    raise ConfigError("batching", mode, "choices: quota, tokens")


def quota_batch(
    waiting: tuple[BatchItem, ...], pred: AttentionTimePredictor, quota_s: float
) -> BatchPlan:
    """Add requests FIFO while predicted attention time stays <= ``quota_s``; the request that
    would overflow is cut to the largest chunk that fits (binary search), then the batch closes."""
    entries: list[BatchEntry] = []
    total = 0.0
    for item in waiting:
        flops = pred.attention_flops(item.cached_len, item.new_len)
        if pred.predict_s(total + flops) <= quota_s:
            entries.append(BatchEntry(request_id=item.request_id, cached_len=item.cached_len,
                                      chunk_len=item.new_len))
            total += flops
            continue
        chunk = _largest_chunk(item, pred, total, quota_s)
        if chunk == 0 and not entries:
            chunk = 1  # a lone request always progresses
        if chunk > 0:
            entries.append(BatchEntry(request_id=item.request_id, cached_len=item.cached_len,
                                      chunk_len=chunk))
            total += pred.attention_flops(item.cached_len, chunk)
        break
    return BatchPlan(entries=tuple(entries), attention_s=pred.predict_s(total))


def _largest_chunk(
    item: BatchItem, pred: AttentionTimePredictor, base_flops: float, quota_s: float
) -> int:
    """Largest k in [0, new_len) with predicted time of (base + flops(cached, k)) <= quota."""
    lo, hi = 0, item.new_len - 1  # invariant: lo fits (0 adds nothing); answer in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if pred.predict_s(base_flops + pred.attention_flops(item.cached_len, mid)) <= quota_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


def token_batch(
    waiting: tuple[BatchItem, ...], max_tokens: int, pred: AttentionTimePredictor | None
) -> BatchPlan:
    """FIFO up to ``max_tokens`` new tokens; the request that overflows is chunked to the rest."""
    entries: list[BatchEntry] = []
    left = max_tokens
    total = 0.0
    for item in waiting:
        if left <= 0:
            break
        chunk = min(item.new_len, left)
        entries.append(BatchEntry(request_id=item.request_id, cached_len=item.cached_len,
                                  chunk_len=chunk))
        left -= chunk
        if pred is not None:
            total += pred.attention_flops(item.cached_len, chunk)
    attention_s = pred.predict_s(total) if pred is not None else 0.0
    return BatchPlan(entries=tuple(entries), attention_s=attention_s)

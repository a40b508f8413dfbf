"""PE batch formation (spec section 8): compute-quota FIFO packing with chunked prefill, or a
plain FIFO token budget for the baselines.

Invariants (property-tested): the batch is a FIFO prefix of ``waiting`` (in ``chunk_order``:
"fresh-first", the default, puts the requests this PE has not started before the ones an earlier
batch cut, each group FIFO; with no ``started`` item, as in the simulator, that is ``waiting``
itself); only its last entry may be chunked; its predicted time is <= the quota, except that a lone
first request always gets at least one token (so a PE never stalls on a request too large for the
quota).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from dualpath.core.errors import ConfigError, DualpathError
from dualpath.policy.config import SchedulerConfig
from dualpath.policy.predictor import AttentionTimePredictor
from dualpath.policy.views import BatchEntry, BatchItem, BatchPlan, BatchView

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchLimits:
    """What a PE reports about its own room; batch formation honours it.

    ``hbm_tokens``: the whole prompts (``cached + new``) of the requests offered to one batch must
    fit the PE's HBM (Basic: no layerwise offload); the first always enters. ``max_items``: at most
    this many requests are offered. Both cut the offer (:func:`batch_candidates`).
    ``staging_tokens``: each entry's ``cached + chunk`` rows, padded to whole ``block_size``
    blocks, summed over the batch, must fit the engine's staging slot; the plan keeps its leading
    entries that fit (the first always). None = no such limit.
    """

    hbm_tokens: int | None = None
    max_items: int | None = None
    staging_tokens: int | None = None
    block_size: int = 1


NO_LIMITS = BatchLimits()


def batch_candidates(
    queue: Iterable[T], admit: Callable[[T], bool], prompt_len: Callable[[T], int], limits: BatchLimits
) -> list[T]:
    """The requests a PE offers to its next batch, in assignment order. ``admit(req)`` is the
    driver's gate (reads done, and room taken in the DE buffer for the KV the PE will send): a
    request it refuses is skipped, not waited for, so the ones behind it may go. The offer stops
    at the first admitted request whose whole prompt no longer fits ``limits.hbm_tokens`` (after
    ``admit`` took its room: the driver gives back room of requests the plan does not pick) and
    after ``limits.max_items`` requests."""
    out: list[T] = []
    room = limits.hbm_tokens
    cap = limits.max_items
    for req in queue:
        if not admit(req):
            continue
        if room is not None:
            need = prompt_len(req)
            if out and need > room:
                break
            room -= need
        out.append(req)
        if cap is not None and len(out) >= cap:
            break
    return out


def fit_staging(entries: tuple[BatchEntry, ...], limits: BatchLimits) -> tuple[BatchEntry, ...]:
    """The leading entries whose block-padded ``cached + chunk`` rows fit ``staging_tokens``."""
    cap = limits.staging_tokens
    if cap is None:
        return entries
    bs = limits.block_size
    used = 0
    for i, e in enumerate(entries):
        used += bs * -(-(e.cached_len + e.chunk_len) // bs)
        if i and used > cap:
            return entries[:i]
    return entries


def plan_batch(
    view: BatchView, config: SchedulerConfig, mode: str, limits: BatchLimits = NO_LIMITS
) -> BatchPlan:
    """Dispatch on ``mode`` ("quota" or "tokens"); the plan honours ``limits.staging_tokens``."""
    plan = _plan(view, config, mode)
    if limits.staging_tokens is None:
        return plan
    kept = fit_staging(plan.entries, limits)
    if len(kept) == len(plan.entries):
        return plan
    pred = config.attention_predictor
    flops = sum(pred.attention_flops(e.cached_len, e.chunk_len) for e in kept) if pred else 0.0
    return BatchPlan(entries=kept, attention_s=pred.predict_s(flops) if pred else 0.0)


def ordered(waiting: tuple[BatchItem, ...], chunk_order: str) -> tuple[BatchItem, ...]:
    """``waiting`` in the order a batch takes it: "fifo" as it is; "fresh-first" the requests not
    started on this PE first, then the started ones (a long prompt cut by the quota gets what a
    batch has left after the requests that came after it, so none of them waits for all of its
    chunks; it still gets the rest of every batch, and all of one that nothing else wants)."""
    if chunk_order == "fifo":
        return waiting
    fresh: list[BatchItem] = []
    started: list[BatchItem] = []
    for item in waiting:
        if item.started:
            started.append(item)
        else:
            fresh.append(item)
    if not started or not fresh:
        return waiting
    return tuple(fresh + started)


def _plan(view: BatchView, config: SchedulerConfig, mode: str) -> BatchPlan:
    for item in view.waiting:
        if item.new_len <= 0 or item.cached_len < 0:
            raise DualpathError(
                f"waiting item {item.request_id!r}: new_len={item.new_len!r} must be > 0 and "
                f"cached_len={item.cached_len!r} >= 0"
            )
    waiting = ordered(view.waiting, config.chunk_order)
    if mode == "quota":
        pred = config.attention_predictor
        if pred is None:
            raise ConfigError("attention_predictor", None, "compute-quota batching needs one")
        return quota_batch(waiting, pred, config.compute_quota_s)
    if mode == "tokens":
        return token_batch(waiting, config.max_batch_tokens, config.attention_predictor)
    raise ConfigError("batching", mode, "choices: quota, tokens")


def quota_batch(waiting: tuple[BatchItem, ...], pred: AttentionTimePredictor, quota_s: float) -> BatchPlan:
    """Add requests FIFO while predicted attention time stays <= ``quota_s``; the request that
    would overflow is cut to the largest chunk that fits (binary search), then the batch closes."""
    entries: list[BatchEntry] = []
    total = 0.0
    for item in waiting:
        flops = pred.attention_flops(item.cached_len, item.new_len)
        if pred.predict_s(total + flops) <= quota_s:
            entries.append(
                BatchEntry(request_id=item.request_id, cached_len=item.cached_len, chunk_len=item.new_len)
            )
            total += flops
            continue
        chunk = _largest_chunk(item, pred, total, quota_s)
        if chunk == 0 and not entries:
            chunk = 1  # a lone request always progresses
        if chunk > 0:
            entries.append(
                BatchEntry(request_id=item.request_id, cached_len=item.cached_len, chunk_len=chunk)
            )
            total += pred.attention_flops(item.cached_len, chunk)
        break
    return BatchPlan(entries=tuple(entries), attention_s=pred.predict_s(total))


def _largest_chunk(item: BatchItem, pred: AttentionTimePredictor, base_flops: float, quota_s: float) -> int:
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
        entries.append(BatchEntry(request_id=item.request_id, cached_len=item.cached_len, chunk_len=chunk))
        left -= chunk
        if pred is not None:
            total += pred.attention_flops(item.cached_len, chunk)
    attention_s = pred.predict_s(total) if pred is not None else 0.0
    return BatchPlan(entries=tuple(entries), attention_s=attention_s)

"""Throughput figures derived from a cost model (for the scheduler's beta and for reports)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dualpath.core.errors import require

if TYPE_CHECKING:
    from dualpath.cost.base import CostModel
    from dualpath.spec.models import ModelSpec


def prefill_tokens_per_s(
    cost: CostModel,
    model: ModelSpec,
    *,
    cached_len: int = 32768,
    new_len: int = 429,
    num_requests: int = 8,
) -> float:
    """New tokens one GPU prefills per second in batches of ``num_requests`` x
    ``(cached_len, new_len)`` (defaults: the paper's 64K-bucket mean context and append).
    The spec's beta = this x 5 s."""
    require(num_requests >= 1, "num_requests", num_requests, "must be >= 1")
    items = [(cached_len, new_len)] * num_requests
    return num_requests * new_len / cost.prefill_iteration_time_s(model, items)


def decode_tokens_per_s(
    cost: CostModel, model: ModelSpec, *, context_len: int = 32768, batch_size: int = 64
) -> float:
    """Tokens one GPU generates per second with ``batch_size`` contexts of ``context_len``."""
    require(batch_size >= 1, "batch_size", batch_size, "must be >= 1")
    return batch_size / cost.decode_step_time_s(model, [context_len] * batch_size)

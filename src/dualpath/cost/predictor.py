"""Attention-time predictors for compute-quota batching, fitted to a cost model.

The policy (``dualpath.policy.AttentionTimePredictor``) asks two things: the theoretical attention
FLOPs of ONE layer for a request's ``(cached_len, new_len)``, and a map from a batch's summed FLOPs
to the wall time of one attention layer. DSA's indexer runs in FP8 at twice the BF16 rate, so the
FLOPs reported here are BF16-equivalent: main attention + ``indexer_weight`` x indexer FLOPs
(``indexer_weight`` = BF16 / FP8 peak, 0.5 on Hopper); for models without an indexer they are
exactly the spec's count. This keeps seconds linear in the reported FLOPs. This module samples the cost model's per-layer attention
time over a grid of batches and fits ``seconds = intercept_s + seconds_per_flop x flops`` by least
squares on relative error (weights 1/seconds^2), the way the paper fits profiled kernels. It is
structurally compatible with the policy's Protocol; cost/ does not import policy/.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from dualpath.core.errors import ConfigError, require
from dualpath.cost.shapes import attention_flops_split

if TYPE_CHECKING:
    from dualpath.spec.models import ModelSpec

GRID_CACHED_LENS = (0, 1024, 4096, 16384, 32768, 65536)
GRID_NEW_LENS = (64, 256, 429, 1024, 4096)
GRID_BATCH_SIZES = (1, 4, 16)


class _AttentionTimed(Protocol):
    def peak_flops(self, dtype_bytes: float) -> float: ...

    def prefill_layer_times_s(
        self, model: ModelSpec, items: Sequence[tuple[int, int]], *, group_num_tokens: int | None = None
    ) -> tuple[float, float]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class FittedAttentionPredictor:
    """``predict_s(flops) = intercept_s + seconds_per_flop x flops`` (0 for no work).

    ``max_rel_error`` is the worst relative error of the fit over its grid (how linear the cost
    model's attention time really is in FLOPs).
    """

    model: ModelSpec
    indexer_weight: float
    seconds_per_flop: float
    intercept_s: float
    max_rel_error: float
    source: str  # name of the cost model it was fitted to

    def __post_init__(self) -> None:
        require(self.seconds_per_flop > 0, "seconds_per_flop", self.seconds_per_flop, "must be > 0")
        require(self.intercept_s >= 0, "intercept_s", self.intercept_s, "must be >= 0")

    def attention_flops(self, cached_len: int, new_len: int) -> float:
        """BF16-equivalent attention FLOPs of ONE layer (DSA cap included, indexer weighted)."""
        main, indexer = attention_flops_split(self.model, cached_len, new_len)
        return main + self.indexer_weight * indexer

    def predict_s(self, flops: float) -> float:
        """Predicted seconds of one attention layer over a batch totalling ``flops``."""
        if flops <= 0:
            return 0.0
        return self.intercept_s + self.seconds_per_flop * flops


def grid_batches(
    cached_lens: Sequence[int] = GRID_CACHED_LENS,
    new_lens: Sequence[int] = GRID_NEW_LENS,
    batch_sizes: Sequence[int] = GRID_BATCH_SIZES,
) -> list[list[tuple[int, int]]]:
    """Uniform batches of ``batch_size`` requests of ``(cached, new)`` over the grid."""
    return [[(c, n)] * b for c, n, b in itertools.product(cached_lens, new_lens, batch_sizes)]


def fit_attention_predictor(
    cost: _AttentionTimed, model: ModelSpec, batches: Sequence[Sequence[tuple[int, int]]] | None = None
) -> FittedAttentionPredictor:
    """Fit a linear FLOPs -> seconds predictor to ``cost``'s per-layer attention time."""
    batches = grid_batches() if batches is None else batches
    weight = cost.peak_flops(2) / cost.peak_flops(1)
    xs: list[float] = []
    ys: list[float] = []
    for batch in batches:
        split = [attention_flops_split(model, c, n) for c, n in batch]
        xs.append(sum(main + weight * indexer for main, indexer in split))
        ys.append(cost.prefill_layer_times_s(model, batch)[0])
    if len(xs) < 2 or max(xs) <= min(xs):
        raise ConfigError("batches", len(batches), "need >= 2 batches with distinct FLOPs")
    x, y = np.asarray(xs), np.asarray(ys)
    w = 1.0 / y  # relative-error weights (sqrt of 1/y^2)
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (intercept, slope), *_ = np.linalg.lstsq(design, y * w, rcond=None)
    if intercept < 0:
        intercept, slope = 0.0, float(np.sum(x * y * w * w) / np.sum(x * x * w * w))
    pred = intercept + slope * x
    return FittedAttentionPredictor(
        model=model,
        indexer_weight=weight,
        seconds_per_flop=float(slope),
        intercept_s=float(intercept),
        max_rel_error=float(np.max(np.abs(pred - y) / y)),
        source=getattr(cost, "name", "?"),
    )

"""Attention-time prediction for compute-quota batching (spec section 8).

The batch planner needs two things per PE: the theoretical attention FLOPs of one layer for a
request's ``(cached_len, new_len)`` span, and a map from a batch's summed FLOPs to wall seconds.
:class:`AttentionTimePredictor` is that seam; ``dualpath.cost`` supplies calibrated predictors, and
:class:`LinearAttentionPredictor` is the simple fitted one that lives here (and is serialisable, so
conformance cases can carry it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dualpath.core.errors import require
from dualpath.spec.model_spec import causal_kv_sum  # re-exported: dualpath.policy.causal_kv_sum


class AttentionTimePredictor(Protocol):
    """Maps attention work to time. Both methods are pure and must be monotone non-decreasing
    (in ``new_len`` and in ``flops``): the batch planner binary-searches over them.

    A plain (static) protocol, so this module compiles with the simulator (mypyc can not compile a
    ``runtime_checkable`` one); check an object at run time with :func:`is_attention_predictor`."""

    def attention_flops(self, cached_len: int, new_len: int) -> float:
        """Theoretical attention FLOPs for ``new_len`` tokens attending to ``cached_len`` cached
        tokens plus the causal new ones (one layer, or all layers for a whole-forward predictor)."""
        ...

    def predict_s(self, flops: float) -> float:
        """Predicted wall time (s) of the attention over a batch totalling ``flops``."""
        ...


def is_attention_predictor(obj: object) -> bool:
    """Does ``obj`` have the two methods of :class:`AttentionTimePredictor`?"""
    return callable(getattr(obj, "attention_flops", None)) and callable(getattr(obj, "predict_s", None))


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardAttentionPredictor:
    """Whole-forward attention time (all ``num_layers`` layers) from a per-layer predictor.

    The compute quota caps a PE batch's attention time per forward pass (the paper's 300 ms), so
    drivers hand the policy this wrapper around their per-layer fit (the simulator's cost-model fit,
    the runtime's measured one). ``attention_flops`` is ``num_layers`` x the layer's FLOPs and
    ``predict_s(flops)`` is ``num_layers`` x the layer's time of ``flops / num_layers`` (a per-batch
    intercept is paid once per layer).
    """

    layer: AttentionTimePredictor
    num_layers: int

    def __post_init__(self) -> None:
        require(self.num_layers >= 1, "num_layers", self.num_layers, "must be >= 1")

    def attention_flops(self, cached_len: int, new_len: int) -> float:
        return self.num_layers * self.layer.attention_flops(cached_len, new_len)

    def predict_s(self, flops: float) -> float:
        return self.num_layers * self.layer.predict_s(flops / self.num_layers)


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionFlops:
    """Per-layer attention FLOPs: ``2 x num_heads x (qk_head_dim + v_head_dim)`` per (query, key)
    pair (QK^T plus PV), times :func:`causal_kv_sum`. For absorbed MLA use qk 576, v 512."""

    num_heads: int
    qk_head_dim: int
    v_head_dim: int
    sparse_top_k: int | None = None

    def __post_init__(self) -> None:
        require(self.num_heads > 0, "num_heads", self.num_heads, "must be > 0")
        require(self.qk_head_dim > 0, "qk_head_dim", self.qk_head_dim, "must be > 0")
        require(self.v_head_dim > 0, "v_head_dim", self.v_head_dim, "must be > 0")
        top_k = self.sparse_top_k
        require(top_k is None or top_k > 0, "sparse_top_k", top_k, "must be > 0 or None")

    def __call__(self, cached_len: int, new_len: int) -> float:
        per_pair = 2.0 * self.num_heads * (self.qk_head_dim + self.v_head_dim)
        return per_pair * causal_kv_sum(cached_len, new_len, self.sparse_top_k)


@dataclass(frozen=True, slots=True, kw_only=True)
class LinearAttentionPredictor:
    """``seconds = intercept_s + seconds_per_flop x flops`` (0 for an empty batch).

    Build it directly or with :meth:`fit` from measured ``(flops, seconds)`` samples.
    """

    flops_model: AttentionFlops
    seconds_per_flop: float
    intercept_s: float = 0.0

    def __post_init__(self) -> None:
        require(self.seconds_per_flop > 0, "seconds_per_flop", self.seconds_per_flop, "must be > 0")
        require(self.intercept_s >= 0, "intercept_s", self.intercept_s, "must be >= 0")

    def attention_flops(self, cached_len: int, new_len: int) -> float:
        return self.flops_model(cached_len, new_len)

    def predict_s(self, flops: float) -> float:
        if flops <= 0:
            return 0.0
        return self.intercept_s + self.seconds_per_flop * flops

    @classmethod
    def fit(
        cls, samples: Sequence[tuple[float, float]], flops_model: AttentionFlops
    ) -> LinearAttentionPredictor:
        """Least-squares fit of ``(flops, seconds)`` samples. If the fitted intercept would be
        negative the line is refitted through the origin (a batch can not take negative time)."""
        require(len(samples) >= 2, "samples", len(samples), "need at least 2 (flops, seconds)")
        xs = [float(x) for x, _ in samples]
        ys = [float(y) for _, y in samples]
        require(all(x >= 0 for x in xs), "samples", samples[:3], "flops must be >= 0")
        require(all(y >= 0 for y in ys), "samples", samples[:3], "seconds must be >= 0")
        n = len(xs)
        mean_x, mean_y = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mean_x) ** 2 for x in xs)
        require(sxx > 0, "samples", samples[:3], "need at least two distinct flops values")
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
        intercept = mean_y - slope * mean_x
        if intercept < 0:
            slope = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
            intercept = 0.0
        require(slope > 0, "samples", samples[:3], "fitted time does not grow with flops")
        return cls(flops_model=flops_model, seconds_per_flop=slope, intercept_s=intercept)

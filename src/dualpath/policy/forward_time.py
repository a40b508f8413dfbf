"""Whole-forward time prediction for compute-quota batching on a device where attention is not
what a forward pass costs (docs/cluster.md, "What the quota bounds").

The paper's quota caps a PE batch's predicted *attention* time (on its GPUs attention is what makes
data-parallel ranks wait for each other). On a CPU thread, with short and medium contexts, the
linear layers dominate instead: a batch of 300 ms of attention can be a forward of a minute, and one
long prompt then holds the only PE while every other request waits. :class:`LinearForwardPredictor`
predicts the whole forward instead, fitted on the engine's own measurements::

    seconds = intercept_s + seconds_per_token x new_tokens + seconds_per_flop x attention_flops

(``attention_flops``: all layers'). It has the two methods of ``AttentionTimePredictor``, so the
quota batching uses it unchanged: its per-request "work" (``attention_flops``) is that request's
seconds beyond the forward's fixed cost, which add up over a batch, and ``predict_s`` adds the
fixed cost once. Both are monotone, as the planner's binary search needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dualpath.core.errors import require
from dualpath.policy.predictor import AttentionFlops


@dataclass(frozen=True, slots=True, kw_only=True)
class LinearForwardPredictor:
    """Forward time of a prefill batch from its new tokens and attention FLOPs (all layers).

    ``flops_model``: one layer's attention FLOPs (``AttentionFlops``); ``num_layers`` scales it.
    """

    flops_model: AttentionFlops
    num_layers: int
    seconds_per_token: float
    seconds_per_flop: float
    intercept_s: float = 0.0

    def __post_init__(self) -> None:
        require(self.num_layers >= 1, "num_layers", self.num_layers, "must be >= 1")
        require(self.seconds_per_token >= 0, "seconds_per_token", self.seconds_per_token, "must be >= 0")
        require(self.seconds_per_flop >= 0, "seconds_per_flop", self.seconds_per_flop, "must be >= 0")
        require(
            self.seconds_per_token > 0 or self.seconds_per_flop > 0,
            "seconds_per_token",
            self.seconds_per_token,
            "and seconds_per_flop cannot both be 0 (time would not grow with work)",
        )
        require(self.intercept_s >= 0, "intercept_s", self.intercept_s, "must be >= 0")

    def attention_flops(self, cached_len: int, new_len: int) -> float:
        """The request's work: seconds it adds to a forward (tokens and attention)."""
        flops = self.num_layers * self.flops_model(cached_len, new_len)
        return self.seconds_per_token * new_len + self.seconds_per_flop * flops

    def predict_s(self, flops: float) -> float:
        """A batch of total work ``flops`` (seconds): plus the forward's fixed cost."""
        return 0.0 if flops <= 0 else self.intercept_s + flops

    @classmethod
    def fit(
        cls, samples: Sequence[tuple[int, float, float]], flops_model: AttentionFlops, num_layers: int
    ) -> LinearForwardPredictor:
        """Least squares over ``(new_tokens, attention_flops of all layers, seconds)`` samples of
        whole forwards (or of one layer with ``num_layers`` = 1, scaled by the caller). A
        coefficient that comes out negative is dropped and the rest refitted (a forward cannot get
        faster with more work)."""
        require(len(samples) >= 3, "samples", len(samples), "need at least 3 (tokens, flops, seconds)")
        require(all(n >= 0 and f >= 0 and s >= 0 for n, f, s in samples), "samples", samples[:3],
                "must be >= 0")  # fmt: skip
        rows = [(1.0, float(n), float(f)) for n, f, _ in samples]
        ys = [float(s) for _, _, s in samples]
        active = [0, 1, 2]
        while True:
            coef = _least_squares([[r[i] for i in active] for r in rows], ys)
            if coef is not None and all(c >= 0 for c in coef):
                break
            drop = active[-1] if coef is None else active[min(range(len(coef)), key=coef.__getitem__)]
            active.remove(drop)
            require(len(active) > 0 and active != [0], "samples", samples[:3],
                    "fitted time does not grow with tokens or FLOPs")  # fmt: skip
        full = dict.fromkeys(range(3), 0.0) | dict(zip(active, coef, strict=True))
        return cls(flops_model=flops_model, num_layers=num_layers, intercept_s=full[0],
                   seconds_per_token=full[1], seconds_per_flop=full[2])  # fmt: skip


def _least_squares(xs: list[list[float]], ys: list[float]) -> list[float] | None:
    """Solve the normal equations (at most 3 unknowns, Gaussian elimination); None if singular.
    The columns are scaled to unit norm first (tokens and FLOPs differ by ~1e9)."""
    k = len(xs[0])
    scale = [max(sum(r[j] ** 2 for r in xs) ** 0.5, 1e-300) for j in range(k)]
    a = [[sum(r[i] * r[j] for r in xs) / (scale[i] * scale[j]) for j in range(k)] for i in range(k)]
    b = [sum(r[i] * y for r, y in zip(xs, ys, strict=True)) / scale[i] for i in range(k)]
    for col in range(k):
        piv = max(range(col, k), key=lambda r: abs(a[r][col]))
        if abs(a[piv][col]) < 1e-12:
            return None
        a[col], a[piv], b[col], b[piv] = a[piv], a[col], b[piv], b[col]
        for r in range(k):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col], strict=True)]
                b[r] -= f * b[col]
    return [b[i] / a[i][i] / scale[i] for i in range(k)]

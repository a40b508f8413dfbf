"""A measured attention-time predictor for compute-quota batching (spec section 8).

At engine start :func:`attention_predictor` times the real decoder's attention (one layer, the same
``Decoder._attention`` call a prefill step makes, with in-place cached KV) on a handful of
``(cached_len, new_len)`` batches, fits ``policy.LinearAttentionPredictor`` to the per-layer
``(FLOPs, seconds)`` samples and returns it wrapped in :class:`ForwardAttentionTime`, which scales
FLOPs and time to a whole forward pass (``num_layers`` layers): the scope of
``SchedulerConfig.compute_quota_s`` (docs/policy.md). Fits are cached per model shape in the
process; tests pass a fixed line instead (:func:`fixed_predictor`) so batches are deterministic.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dualpath.core.errors import require
from dualpath.policy import AttentionFlops, ForwardAttentionPredictor, LinearAttentionPredictor
from dualpath.runtime.model import Decoder, Span

# Batches timed by default: one or more requests of (cached_len, new_len); clipped to the context.
PROFILE_BATCHES: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, 32),), ((0, 128),), ((256, 64),), ((512, 128),), ((1024, 128),), ((1024, 256),),
    ((128, 32),) * 4,
)  # fmt: skip
PROFILE_REPEATS = 5  # min over repeats (after one warm-up) of each batch


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardAttentionTime(ForwardAttentionPredictor):
    """:class:`ForwardAttentionPredictor` over a measured :class:`LinearAttentionPredictor`, with
    the fitted line's numbers for logs."""

    @property
    def seconds_per_gflop(self) -> float:
        """Fitted slope (the same per layer and per forward)."""
        return self._line.seconds_per_flop * 1e9

    @property
    def intercept_s(self) -> float:
        """Fixed cost of one forward's attention (``num_layers`` x the layer's intercept)."""
        return self.num_layers * self._line.intercept_s

    @property
    def _line(self) -> LinearAttentionPredictor:
        assert isinstance(self.layer, LinearAttentionPredictor)
        return self.layer


def flops_model(decoder: Decoder) -> AttentionFlops:
    """Per-layer attention FLOPs of ``decoder`` (QK^T and PV over the query heads)."""
    cfg = decoder.config
    return AttentionFlops(num_heads=cfg.num_heads, qk_head_dim=cfg.head_dim, v_head_dim=cfg.head_dim)


def fixed_predictor(
    decoder: Decoder, *, seconds_per_gflop: float, intercept_s: float = 0.0
) -> ForwardAttentionTime:
    """A whole-forward predictor with a given line (deterministic batches for tests and configs):
    ``seconds_per_gflop`` slope, ``intercept_s`` per forward pass."""
    require(seconds_per_gflop > 0, "seconds_per_gflop", seconds_per_gflop, "must be > 0")
    require(intercept_s >= 0, "intercept_s", intercept_s, "must be >= 0")
    layers = decoder.num_layers
    line = LinearAttentionPredictor(
        flops_model=flops_model(decoder),
        seconds_per_flop=seconds_per_gflop / 1e9,
        intercept_s=intercept_s / layers,
    )
    return ForwardAttentionTime(layer=line, num_layers=layers)


_CACHE: dict[tuple[object, ...], ForwardAttentionTime] = {}


def attention_predictor(
    decoder: Decoder,
    *,
    fixed: ForwardAttentionTime | None = None,
    batches: Sequence[Sequence[tuple[int, int]]] = PROFILE_BATCHES,
) -> ForwardAttentionTime:
    """``fixed`` if given, else the measured fit for this model shape (profiled once per process)."""
    if fixed is not None:
        return fixed
    key = (decoder.config, decoder.dtype, str(decoder.device), tuple(map(tuple, batches)))
    if key not in _CACHE:
        samples = profile_attention(decoder, batches)
        layer = LinearAttentionPredictor.fit(samples, flops_model(decoder))
        _CACHE[key] = ForwardAttentionTime(layer=layer, num_layers=decoder.num_layers)
    return _CACHE[key]


def profile_attention(
    decoder: Decoder,
    batches: Sequence[Sequence[tuple[int, int]]] = PROFILE_BATCHES,
    repeats: int = PROFILE_REPEATS,
) -> list[tuple[float, float]]:
    """Per-layer ``(FLOPs, seconds)`` of ``decoder``'s attention for each batch (min of ``repeats``)."""
    fl = flops_model(decoder)
    max_len = decoder.config.max_position_embeddings
    samples = []
    for batch in batches:
        spans = [_clip(c, n, max_len) for c, n in batch]
        args = _inputs(decoder, spans)
        best = float("inf")
        with torch.inference_mode():
            for i in range(repeats + 1):
                t0 = time.perf_counter()
                decoder._attention(*args, cache_has_room=True)  # noqa: SLF001 (the real kernel)
                _sync(decoder.device)
                if i:  # the first call warms up
                    best = min(best, time.perf_counter() - t0)
        samples.append((sum(fl(s.cached_len, s.new_len) for s in spans), best))
    return samples


def _clip(cached_len: int, new_len: int, max_len: int) -> Span:
    new = max(1, min(new_len, max_len))
    return Span(max(0, min(cached_len, max_len - new)), new)


_Inputs = tuple[torch.Tensor, torch.Tensor, list[Span], list[torch.Tensor | None]]


def _inputs(dec: Decoder, spans: list[Span]) -> _Inputs:
    """Random q, new K/V and per-span cached KV with room for the new rows (``cache_has_room``)."""
    cfg, gen = dec.config, torch.Generator().manual_seed(0)
    total = sum(s.new_len for s in spans)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=dec.device, dtype=dec.dtype)

    q = rnd(total, cfg.num_heads, cfg.head_dim)
    new_kv = rnd(total, 2, cfg.num_kv_heads, cfg.head_dim)
    cached = [rnd(s.cached_len + s.new_len, 2, cfg.num_kv_heads, cfg.head_dim) if s.cached_len else None
              for s in spans]  # fmt: skip
    return q, new_kv, spans, cached


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

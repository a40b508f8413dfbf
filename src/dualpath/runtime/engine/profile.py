"""Measured time predictors for compute-quota batching (spec section 8; docs/cluster.md, "What the quota bounds").

:func:`forward_predictor` (what a runtime PE batches by, ``EngineConfig.quota_scope`` "forward")
times one decoder layer's whole forward (``Decoder.run_layer``: norms, QKV, RoPE, attention over
in-place cached KV, o_proj, MLP) plus the final norm and LM head on ``FORWARD_BATCHES``, and fits
``policy.LinearForwardPredictor`` (intercept, seconds per new token, seconds per attention FLOP;
``num_layers`` x the layer's time): on a CPU thread the linear layers, not attention, are most of a
forward, so only this bounds the time one batch holds the PE. It is the decoder's compute: the
layer-by-layer KV hand-off to the DE and the staging copies of a real step come on top.

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
from dualpath.policy.forward_time import LinearForwardPredictor
from dualpath.runtime.model import Decoder, Span

# Batches timed by default: one or more requests of (cached_len, new_len); clipped to the context.
PROFILE_BATCHES: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, 32),), ((0, 128),), ((256, 64),), ((512, 128),), ((1024, 128),), ((1024, 256),),
    ((128, 32),) * 4,
)  # fmt: skip
PROFILE_REPEATS = 5  # min over repeats (after one warm-up) of each batch
# Batches of the forward profile: new tokens from 16 to 512 (the linear term), cached up to 4096
# (the attention term; clipped to the context), and one four-request batch.
FORWARD_BATCHES: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, 16),), ((0, 64),), ((0, 256),), ((0, 512),), ((1024, 64),), ((4096, 32),), ((2048, 128),),
    ((128, 32),) * 4,
)  # fmt: skip
FORWARD_REPEATS = 3


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


_FORWARD_CACHE: dict[tuple[object, ...], LinearForwardPredictor] = {}


def forward_predictor(
    decoder: Decoder, batches: Sequence[Sequence[tuple[int, int]]] = FORWARD_BATCHES
) -> LinearForwardPredictor:
    """The measured whole-forward fit for this model shape (profiled once per process)."""
    key = (decoder.config, decoder.dtype, str(decoder.device), tuple(map(tuple, batches)))
    if key not in _FORWARD_CACHE:
        layers = decoder.num_layers
        fl = flops_model(decoder)
        samples = [(n, layers * f, s) for n, f, s in profile_forward(decoder, batches)]
        _FORWARD_CACHE[key] = LinearForwardPredictor.fit(samples, fl, layers)
    return _FORWARD_CACHE[key]


def profile_forward(
    decoder: Decoder,
    batches: Sequence[Sequence[tuple[int, int]]] = FORWARD_BATCHES,
    repeats: int = FORWARD_REPEATS,
) -> list[tuple[int, float, float]]:
    """``(new tokens, one layer's attention FLOPs, seconds of a whole forward)`` per batch: one
    layer timed (min of ``repeats`` after a warm-up) times ``num_layers``, plus the LM head. On a
    CPU the clock is the thread's CPU time (what the forward costs its one thread; wall time on a
    shared machine would fit the other processes' load), on a GPU wall time after a sync."""
    fl, cfg = flops_model(decoder), decoder.config
    out = []
    for batch in batches:
        spans = [_clip(c, n, cfg.max_position_embeddings) for c, n in batch]
        _, _, _, cached = _inputs(decoder, spans)
        total = sum(s.new_len for s in spans)
        hidden = torch.randn(total, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
        hidden = hidden.to(device=decoder.device, dtype=decoder.dtype)
        rope = decoder.rope(decoder.positions(spans))
        best, clock = float("inf"), _clock(decoder.device)
        with torch.inference_mode():
            for i in range(repeats + 1):
                t0 = clock()
                h, _ = decoder.run_layer(0, hidden, spans, cached, rope, cache_has_room=True)
                _sync(decoder.device)
                layer_s = clock() - t0
                t1 = clock()
                decoder.final(h[: len(spans)])
                _sync(decoder.device)
                if i:
                    best = min(best, decoder.num_layers * layer_s + clock() - t1)
        out.append((total, sum(fl(s.cached_len, s.new_len) for s in spans), best))
    return out


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


def _clock(device: torch.device):  # type: ignore[no-untyped-def]
    return time.thread_time if device.type == "cpu" else time.perf_counter


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

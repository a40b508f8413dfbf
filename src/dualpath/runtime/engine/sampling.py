"""Token choice from logits: greedy, or temperature + nucleus (top-p) sampling.

Sampling is seeded per (request seed, position in the generation), so a request draws the same tokens
whichever engine samples a given step (the PE samples the first token, the DE the rest).

Numerically safe for any parameters the types admit: logits are shifted by their maximum *before*
dividing by the temperature (so ``(logits - max) / t`` is <= 0 and never NaN however small ``t``
is), computed in float32; the top token is always kept by top-p (a ``top_p`` that is 0 in float32
keeps exactly it); the generator seed is reduced modulo 2**64. If the probabilities still are not
a usable distribution (a non-finite logit from the model, a row summing to 0), the token is the
greedy argmax (NaN counted as -inf): the limit of sampling as the temperature goes to 0, and a
valid token id whatever happened. ``sample_token`` never raises for a 1-D row of logits.
"""

from __future__ import annotations

import torch

from dualpath.runtime.engine.types import SamplingParams

_SEED_MOD = 2**64  # torch.Generator.manual_seed takes an unsigned 64-bit seed
_SEED_MIX = 1_000_003


def generator_seed(seed: int, step: int) -> int:
    """The seed of step ``step`` of a request seeded ``seed``, in [0, 2**64)."""
    return (seed * _SEED_MIX + step) % _SEED_MOD


def greedy_token(logits: torch.Tensor) -> int:
    """Argmax of the logits with NaN counted as -inf (0 if every entry is NaN or -inf)."""
    x = torch.nan_to_num(logits.to(torch.float32), nan=float("-inf"))
    return int(torch.argmax(x).item())


def sample_token(logits: torch.Tensor, params: SamplingParams, step: int) -> int:
    """The token for generation step ``step`` (0 = first token) from one row of logits."""
    if params.temperature == 0.0:
        return greedy_token(logits)
    x = torch.nan_to_num(logits.to(torch.float32), nan=float("-inf"))
    top = torch.max(x)
    if not torch.isfinite(top):  # a +inf logit (take it) or nothing finite
        return greedy_token(logits)
    probs = torch.softmax((x - top) / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < params.top_p
        keep[0] = True  # the top token, even when top_p is 0 in float32
        sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    total = float(probs.sum())
    if not (total > 0.0 and torch.isfinite(probs).all()):
        return greedy_token(logits)
    gen = torch.Generator(device="cpu").manual_seed(generator_seed(params.seed or 0, step))
    return int(torch.multinomial(probs.cpu(), 1, generator=gen).item())

"""Token choice from logits: greedy, or temperature + nucleus (top-p) sampling.

Sampling is seeded per (request seed, position in the generation), so a request draws the same tokens
whichever engine samples a given step (the PE samples the first token, the DE the rest).
"""

from __future__ import annotations

import torch

from dualpath.runtime.engine.types import SamplingParams


def sample_token(logits: torch.Tensor, params: SamplingParams, step: int) -> int:
    """The token for generation step ``step`` (0 = first token) from one row of logits."""
    if params.temperature == 0.0:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.to(torch.float32) / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < params.top_p  # always keeps the top token
        sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    gen = torch.Generator(device="cpu").manual_seed(params.seed * 1_000_003 + step)
    return int(torch.multinomial(probs.cpu(), 1, generator=gen).item())

"""Request-by-request datasets: a Mooncake trace replayed at its own timing, or random prompts.

Mooncake prompts are built from the trace's ``hash_ids``: block ``h`` is ``block_len`` token ids
drawn from a generator seeded by ``(seed, h)``, so two requests that share a prefix of hash ids
send the same leading tokens and a prefix cache can hit exactly where the recorded system hit.
The trace's 512-token blocks become ``block_len`` tokens each (the last, partial block in
proportion, and output lengths by the same factor), which sizes a trace down without changing
which requests share what. A request that still does not fit the endpoint's context is cut to
fit (output first capped at half the context, then the prompt's tail dropped: its prefix, and so
its sharing, is kept); ``truncated`` marks it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dualpath.bench.arrivals import arrival_times_s, trace_times_s
from dualpath.bench.config import BenchConfig
from dualpath.core.errors import ConfigError
from dualpath.workload.traces import MOONCAKE_BLOCK_LEN, read_mooncake


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestSpec:
    """One request to send at ``arrival_s``: ``input_len`` prompt tokens (from ``hash_ids``
    blocks, or random when None) and ``output_len`` forced output tokens."""

    index: int
    arrival_s: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...] | None = None
    truncated: bool = False


def _fit(spec: RequestSpec, context_len: int) -> RequestSpec:
    if spec.input_len + spec.output_len <= context_len:
        return spec
    out = min(spec.output_len, max(1, context_len // 2))
    return RequestSpec(
        index=spec.index,
        arrival_s=spec.arrival_s,
        output_len=out,
        input_len=max(1, min(spec.input_len, context_len - out)),
        hash_ids=spec.hash_ids,
        truncated=True,
    )


def mooncake_requests(cfg: BenchConfig, context_len: int) -> list[RequestSpec]:
    """The first ``num_prompts`` records of ``dataset_path`` (all when None), scaled to
    ``block_len`` tokens per hash block, timed by the trace (``time_scale``) or ``request_rate``."""
    assert cfg.dataset_path is not None
    records = read_mooncake(cfg.dataset_path, limit=cfg.num_prompts)
    factor = cfg.block_len / MOONCAKE_BLOCK_LEN
    if cfg.request_rate == float("inf"):
        times = trace_times_s([r.arrival_s for r in records], cfg.time_scale)
    else:
        times = arrival_times_s(len(records), cfg.request_rate, cfg.burstiness, cfg.seed)
    out = []
    for i, (rec, t) in enumerate(zip(records, times)):
        last = rec.input_len - MOONCAKE_BLOCK_LEN * (len(rec.hash_ids) - 1)
        input_len = cfg.block_len * (len(rec.hash_ids) - 1) + min(cfg.block_len, max(1, round(last * factor)))
        output_len = cfg.output_len or max(1, round(rec.output_len * factor))
        out.append(
            _fit(
                RequestSpec(
                    index=i, arrival_s=t, input_len=input_len, output_len=output_len, hash_ids=rec.hash_ids
                ),
                context_len,
            )
        )
    return out


def random_requests(cfg: BenchConfig, context_len: int) -> list[RequestSpec]:
    """``num_prompts`` (default 8) prompts of ``input_len`` random tokens, ``output_len`` (default
    16) output tokens each, arriving at ``request_rate``."""
    n = cfg.num_prompts or 8
    output_len = cfg.output_len or 16
    if cfg.input_len + output_len > context_len:
        raise ConfigError(
            "input_len",
            cfg.input_len,
            f"+ output_len {output_len} exceeds the endpoint's context of {context_len} tokens",
        )
    times = arrival_times_s(n, cfg.request_rate, cfg.burstiness, cfg.seed)
    return [
        RequestSpec(index=i, arrival_s=t, input_len=cfg.input_len, output_len=output_len)
        for i, t in enumerate(times)
    ]


class PromptBuilder:
    """Token ids of a request: hash-id blocks (cached per block) or per-request random ids."""

    def __init__(self, cfg: BenchConfig, vocab_size: int) -> None:
        self._seed = cfg.tokens_seed
        self._block_len = cfg.block_len
        self._lo = cfg.min_token_id
        self._hi = vocab_size
        self._blocks: dict[int, list[int]] = {}

    def block(self, hash_id: int) -> list[int]:
        """The ``block_len`` ids of hash block ``hash_id`` (same id, same ids, every time)."""
        ids = self._blocks.get(hash_id)
        if ids is None:
            rng = np.random.default_rng([self._seed, 1 << 20, hash_id % (1 << 63)])
            ids = [int(t) for t in rng.integers(self._lo, self._hi, size=self._block_len)]
            self._blocks[hash_id] = ids
        return ids

    def prompt(self, spec: RequestSpec) -> list[int]:
        if spec.hash_ids is None:
            rng = np.random.default_rng([self._seed, 2000 + spec.index])
            return [int(t) for t in rng.integers(self._lo, self._hi, size=spec.input_len)]
        ids: list[int] = []
        for h in spec.hash_ids:
            if len(ids) >= spec.input_len:
                break
            ids.extend(self.block(h))
        return ids[: spec.input_len]

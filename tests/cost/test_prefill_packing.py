"""Prefill packing of aggregated serving (cost/prefill_packing.py): no kernel tables needed."""

from __future__ import annotations

import numpy as np
import pytest

from dualpath.cost.prefill_packing import cyclic_cover, greedy, prefill_step, whole


def test_greedy_fills_every_iteration_and_prompts_straddle() -> None:
    p = greedy(32, 4000, 8160)  # vLLM at 32 clients: 2 prompts + 160 tokens of the third
    assert p.iterations == 16 and p.tokens.sum() == 32 * 4000
    assert (p.tokens[:-1] == 8160).all() and 0 < p.tokens[-1] <= 8160
    assert p.own.mean() == pytest.approx(1 + 15 / 32)  # each inner boundary cuts one prompt
    assert (p.first[1:] >= p.first[:-1]).all() and (p.first[1:] <= p.last[:-1]).all()  # adjacent


def test_an_exact_fit_counts_as_a_cut() -> None:
    # the last token of a prompt ending on a boundary waits for the next iteration (module doc)
    p = greedy(2, 4000, 8000)
    assert p.first.tolist() == [0, 0] and p.last.tolist() == [0, 1] and p.tokens.tolist() == [8000, 0]
    small = greedy(4, 2000, 8192)  # everything in one iteration
    assert small.iterations == 1 and small.own.tolist() == [1, 1, 1, 1]


def test_whole_prompts_even_out_the_groups() -> None:
    p = whole(32, 3000, 8160)  # 2 per iteration: 16 groups of 2
    assert p.iterations == 16 and p.weight == 2 and (p.tokens == 6000).all() and (p.own == 1).all()
    long = whole(4, 9000, 8160)  # longer than the budget: one whole prompt per iteration
    assert long.iterations == 4 and long.weight == 1


def test_a_chunk_is_priced_with_the_prompts_gemm_tokens_and_attention_pairs() -> None:
    full, chunk = prefill_step(8000, 4000), prefill_step(3000, 8000)
    assert full.ctx_requests == 2 and full.isl == 4000 and full.num_tokens == 8000
    assert chunk.ctx_requests == 1 and chunk.num_tokens == 3000 and chunk.prefix == 2500
    # pairs of a chunk after its prefix: isl^2 + 2 isl prefix = tok x isl, as the prompts'
    assert chunk.isl * (chunk.isl + 2 * chunk.prefix) == 3000 * 8000
    assert prefill_step(0, 8000, gen_requests=3).ctx_requests == 0


def test_cyclic_cover_matches_counting() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        period = int(rng.integers(1, 30))
        starts = rng.integers(-40, 40, size=int(rng.integers(1, 8)))
        lengths = rng.integers(0, 70, size=len(starts))
        want = np.zeros(period, dtype=np.int64)
        for s, n in zip(starts, lengths, strict=True):
            for k in range(int(n)):
                want[(s + k) % period] += 1
        assert cyclic_cover(period, starts, lengths).tolist() == want.tolist()

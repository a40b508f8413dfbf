"""The measured attention predictor (runtime/engine/profile.py) and compute-quota batching through the
real prefill engine: a small quota packs fewer requests and chunks the overflowing one, outputs stay
exact."""

from __future__ import annotations

from typing import Any

import torch

from dualpath.policy import is_attention_predictor
from dualpath.runtime.engine import LocalConfig, LocalPipeline
from dualpath.runtime.engine.profile import (
    ForwardAttentionTime,
    attention_predictor,
    fixed_predictor,
    flops_model,
    profile_attention,
)  # fmt: skip
from dualpath.runtime.model import Decoder

from .conftest import random_tokens, run_conversation


def test_fit_is_positive_monotone_whole_forward_and_cached(tiny_llama: tuple[Decoder, Any]) -> None:
    dec, _ = tiny_llama
    samples = profile_attention(dec, batches=(((0, 16),), ((64, 64),)), repeats=1)
    assert len(samples) == 2 and all(f > 0 and s > 0 for f, s in samples)
    assert samples[1][0] > samples[0][0]
    pred = attention_predictor(dec)
    assert is_attention_predictor(pred) and isinstance(pred, ForwardAttentionTime)
    assert pred.seconds_per_gflop > 0 and pred.intercept_s >= 0 and pred.num_layers == dec.num_layers
    assert attention_predictor(dec) is pred  # one profile per model in the process
    layer_flops = flops_model(dec)(100, 50)
    assert pred.attention_flops(100, 50) == dec.num_layers * layer_flops
    times = [pred.predict_s(pred.attention_flops(c, n)) for c, n in [(0, 1), (0, 64), (256, 64), (512, 256)]]
    assert all(0 < a < b for a, b in zip(times, times[1:])), times
    fixed = fixed_predictor(dec, seconds_per_gflop=2.0, intercept_s=0.003)
    assert attention_predictor(dec, fixed=fixed) is fixed
    assert abs(fixed.predict_s(1e9) - (2.0 + 0.003)) < 1e-12


def _batches(dec: Decoder, hf: Any, kv_dir: str, quota_units: float) -> list[tuple[tuple[str, int], ...]]:
    """Prefill batches of three 40-token prompts under a quota of ``quota_units`` prompts' worth of
    predicted attention (fixed predictor: deterministic); outputs are checked against transformers."""
    pred = fixed_predictor(dec, seconds_per_gflop=1.0)
    one = pred.predict_s(pred.attention_flops(0, 40))
    gen = torch.Generator().manual_seed(21)
    cfg = LocalConfig(
        kv_dir=kv_dir, block_size=16, attention_predictor=pred, compute_quota_s=quota_units * one
    )
    with LocalPipeline(dec, cfg) as pipe:
        assert pipe.scheduler.batching == "quota"
        prompts = {k: random_tokens(gen, 40) for k in "abc"}
        run_conversation(pipe, hf, prompts=prompts, sides=lambda k, t: "pe", num_turns=1, gen=gen)
        return pipe.prefill_batches


def test_small_quota_packs_fewer_requests_and_chunks_the_overflow(
    tiny_llama: tuple[Decoder, Any], tmp_path: Any
) -> None:
    dec, hf = tiny_llama
    big = _batches(dec, hf, str(tmp_path / "big"), 10.0)
    assert big == [(("a-t0", 40), ("b-t0", 40), ("c-t0", 40))]
    small = _batches(dec, hf, str(tmp_path / "small"), 1.5)
    first = small[0]
    assert [rid for rid, _ in first] == ["a-t0", "b-t0"] and first[0][1] == 40
    assert 0 < first[1][1] < 40  # the overflowing request is chunked to what still fits
    assert len(small) >= 2 and all(len(b) <= 2 for b in small)
    computed: dict[str, int] = {}
    for batch in small:
        for rid, n in batch:
            computed[rid] = computed.get(rid, 0) + n
    assert computed == {"a-t0": 40, "b-t0": 40, "c-t0": 40}


def test_baseline_policy_keeps_token_batching(tiny_llama: tuple[Decoder, Any], kv_dir: str) -> None:
    dec, _ = tiny_llama
    cfg = LocalConfig(
        kv_dir=kv_dir,
        policy="basic",
        max_batch_tokens=24,
        attention_predictor=fixed_predictor(dec, seconds_per_gflop=1.0),
    )
    with LocalPipeline(dec, cfg) as pipe:
        assert pipe.scheduler.batching == "tokens"

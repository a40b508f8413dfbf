"""No sampling parameter can break an engine: every value the wire format admits samples a token id
in range through the real prefill and decode engines; every other value is refused at decode."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.runtime.cluster import api
from dualpath.runtime.engine import GenRequest, LocalConfig, LocalPipeline, SamplingParams, sample_token
from dualpath.runtime.engine.sampling import generator_seed, greedy_token
from dualpath.runtime.model import Decoder

EXTREME_FLOATS = [
    0.0,
    -0.0,
    1e-39,
    5e-324,
    1e-45,
    1e-5,
    1e-2,
    0.5,
    1.0,
    2.0,
    1e38,
    1e308,
    -1e-39,
    math.inf,
    -math.inf,
    math.nan,
]
EXTREME_INTS = [0, 1, -1, 2**31, 2e13, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 2**70, -(2**70)]
_float = st.sampled_from(EXTREME_FLOATS) | st.floats(allow_nan=True, allow_infinity=True)
_int = st.sampled_from([int(i) for i in EXTREME_INTS]) | st.integers(-(2**72), 2**72)
_params = st.fixed_dictionaries(
    {},
    optional={
        "temperature": _float,
        "top_p": _float,
        "seed": st.none() | _int,
        "stop_token_ids": st.lists(_int, max_size=3),
        "max_tokens": st.integers(1, 3),
        "ignore_eos": st.booleans(),
    },
)


def test_random_sampling_parameters_never_break_the_engines(
    tiny_llama: tuple[Decoder, Any], tmp_path: Path
) -> None:
    dec, _ = tiny_llama
    vocab = dec.config.vocab_size
    prompt = tuple(range(3, 15))
    rids = itertools.count()
    refused = accepted = 0
    with LocalPipeline(dec, LocalConfig(kv_dir=str(tmp_path), block_size=8, num_cache_blocks=64)) as pipe:

        @settings(max_examples=200, deadline=None, database=None)
        @given(raw=_params)
        def run(raw: dict[str, Any]) -> None:
            nonlocal refused, accepted
            try:  # what the scheduler and the engines decode from the wire
                wire = msgspec.convert(raw, api.SamplingParams)
            except msgspec.ValidationError:
                refused += 1
                return
            accepted += 1
            rid = f"r{next(rids)}"
            out = pipe.generate([GenRequest(request_id=rid, token_ids=prompt, sampling=wire)])[
                rid
            ]  # the engines take it as is
            assert 1 <= len(out.tokens) <= wire.max_tokens
            assert all(0 <= t < vocab for t in out.tokens), out.tokens

        run()
    assert refused > 0 and accepted > 0  # both sides of the edge were exercised


@pytest.mark.parametrize("temperature", [1e-39, 5e-324, 1e-5, 1.0, 2.0, 1e38])
@pytest.mark.parametrize("top_p", [5e-324, 1e-45, 0.5, 1.0])
@pytest.mark.parametrize("seed", [0, int(2e13), 2**63 - 1, -(2**63)])  # (2**70: refused, below)
def test_issue_13_poison_values_sample_a_valid_token(temperature: float, top_p: float, seed: int) -> None:
    logits = torch.randn(300, generator=torch.Generator().manual_seed(1)) * 30
    tok = sample_token(logits, SamplingParams(temperature=temperature, top_p=top_p, seed=seed), 3)
    assert 0 <= tok < 300
    if temperature <= 1e-5 or (top_p < 1e-6 and temperature <= 2.0):  # sharpest: the argmax
        assert tok == int(logits.argmax())


def test_the_one_sampling_type_refuses_seeds_beyond_64_bits() -> None:
    from dualpath.core.errors import ConfigError

    with pytest.raises(ConfigError, match="seed"):
        SamplingParams(temperature=1.0, seed=2**70)


@pytest.mark.parametrize(
    "row",
    [
        [float("nan")] * 5,
        [float("-inf")] * 5,
        [1.0, float("nan"), 3.0, float("-inf"), 2.0],
        [1.0, float("inf"), 0.0, 2.0, 3.0],
        [3e38, 3e38, -3e38, 0.0, 1.0],
        [0.0] * 5,
    ],
)
@pytest.mark.parametrize("temperature", [0.0, 1e-39, 1.0])
def test_broken_logits_fall_back_to_a_valid_token(row: list[float], temperature: float) -> None:
    logits = torch.tensor(row, dtype=torch.float32)
    tok = sample_token(logits, SamplingParams(temperature=temperature, top_p=0.9, seed=1), 0)
    assert 0 <= tok < len(row)
    if any(math.isinf(v) and v > 0 for v in row):
        assert tok == row.index(float("inf"))
    assert greedy_token(logits) == sample_token(logits, SamplingParams(), 0)


def test_generator_seed_is_unsigned_64_bit_and_keeps_small_seeds() -> None:
    assert generator_seed(5, 2) == 5 * 1_000_003 + 2  # existing seeded draws are unchanged
    for seed in (-(2**63), -1, 2**63 - 1, 2**70):
        assert 0 <= generator_seed(seed, 7) < 2**64
        torch.Generator().manual_seed(generator_seed(seed, 7))

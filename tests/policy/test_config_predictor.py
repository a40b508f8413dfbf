from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.core.errors import ConfigError
from dualpath.policy import (
    AttentionFlops,
    LinearAttentionPredictor,
    SchedulerConfig,
    causal_kv_sum,
    derive_thresholds,
)


def test_paper_thresholds() -> None:
    alpha, beta = derive_thresholds(
        snic_bytes_per_s=50e9, kv_bytes_per_token=40_016, prefill_tokens_per_s=121_000
    )
    assert alpha == int(3 * 50e9 / 40_016) == 3_748_500
    assert beta == 605_000
    cfg = SchedulerConfig()
    assert (cfg.alpha_tokens, cfg.beta_tokens) == (alpha, beta)


def test_from_rates_and_overrides() -> None:
    cfg = SchedulerConfig.from_rates(
        snic_bytes_per_s=100e9, kv_bytes_per_token=1000, prefill_tokens_per_s=10, beta_tokens=7
    )
    assert cfg.alpha_tokens == 300_000_000
    assert cfg.beta_tokens == 7


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"compute_quota_s": 0}, "compute_quota_s"),
        ({"hbm_slack": 0.9}, "hbm_slack"),
        ({"batching": "greedy"}, "batching"),
        ({"block_size": 0}, "block_size"),
        ({"attention_predictor": 3}, "attention_predictor"),
        ({"alpha_tokens": -1}, "alpha_tokens"),
    ],
)
def test_bad_config_names_key_and_value(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        SchedulerConfig(**kwargs)  # type: ignore[arg-type]
    assert err.value.key == key
    assert repr(next(iter(kwargs.values()))) in str(err.value)


def test_derive_rejects_zero_rate() -> None:
    with pytest.raises(ConfigError, match="snic_bytes_per_s=0"):
        derive_thresholds(snic_bytes_per_s=0, kv_bytes_per_token=1, prefill_tokens_per_s=1)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 3000), st.integers(0, 300), st.one_of(st.none(), st.integers(1, 4000)))
def test_causal_kv_sum_matches_brute_force(cached: int, new: int, cap: int | None) -> None:
    brute = sum(min(cached + i, cap) if cap else cached + i for i in range(1, new + 1))
    assert causal_kv_sum(cached, new, cap) == brute


def test_attention_flops_mla_shape() -> None:
    flops = AttentionFlops(num_heads=128, qk_head_dim=576, v_head_dim=512, sparse_top_k=2048)
    # one query over 10,000 cached tokens, capped at 2,048 keys
    assert flops(10_000, 1) == 2 * 128 * (576 + 512) * 2048


def test_fit_recovers_line_and_clamps_negative_intercept() -> None:
    model = AttentionFlops(num_heads=1, qk_head_dim=1, v_head_dim=1)
    samples = [(x, 0.01 + 2e-12 * x) for x in (1e9, 5e9, 2e10, 8e10)]
    pred = LinearAttentionPredictor.fit(samples, model)
    assert pred.seconds_per_flop == pytest.approx(2e-12)
    assert pred.intercept_s == pytest.approx(0.01)
    assert pred.predict_s(0) == 0.0
    through_origin = LinearAttentionPredictor.fit([(1.0, 0.0), (2.0, 2.0), (3.0, 4.0)], model)
    assert through_origin.intercept_s == 0.0
    assert through_origin.seconds_per_flop > 0


def test_fit_rejects_degenerate_samples() -> None:
    model = AttentionFlops(num_heads=1, qk_head_dim=1, v_head_dim=1)
    with pytest.raises(ConfigError, match="distinct"):
        LinearAttentionPredictor.fit([(1.0, 1.0), (1.0, 2.0)], model)
    with pytest.raises(ConfigError, match="at least 2"):
        LinearAttentionPredictor.fit([(1.0, 1.0)], model)


def test_for_node_uses_spec_tables() -> None:
    from dualpath.spec.hardware import get_node
    from dualpath.spec.models import get_model

    cfg = SchedulerConfig.for_node(
        get_node("hopper-8x400"), get_model("deepseek-v3.2"), prefill_tokens_per_s=121_000
    )
    assert cfg == SchedulerConfig()  # the defaults are the paper's node and model

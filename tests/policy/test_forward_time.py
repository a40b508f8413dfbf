"""The whole-forward time predictor and the fresh-first chunk order (issue 30, item 2)."""

from __future__ import annotations

import pytest

from dualpath.core.errors import DualpathError
from dualpath.policy import AttentionFlops, BatchItem, BatchView, SchedulerConfig, make_scheduler
from dualpath.policy.batch import ordered
from dualpath.policy.forward_time import LinearForwardPredictor

FL = AttentionFlops(num_heads=9, qk_head_dim=64, v_head_dim=64)


def _line(**kw: float) -> LinearForwardPredictor:
    return LinearForwardPredictor(flops_model=FL, num_layers=30, **kw)  # type: ignore[arg-type]


def test_fit_recovers_a_known_line_and_drops_a_negative_term() -> None:
    true = _line(seconds_per_token=2.5e-3, seconds_per_flop=5e-11, intercept_s=0.03)
    spans = [(0, 16), (0, 64), (0, 256), (0, 512), (1024, 64), (4096, 32), (2048, 128)]
    samples = [(n, 30 * FL(c, n), true.predict_s(true.attention_flops(c, n))) for c, n in spans]
    fit = LinearForwardPredictor.fit(samples, FL, 30)
    assert fit.seconds_per_token == pytest.approx(2.5e-3, rel=1e-6)
    assert fit.seconds_per_flop == pytest.approx(5e-11, rel=1e-6)
    assert fit.intercept_s == pytest.approx(0.03, rel=1e-6)
    # time falling with FLOPs at equal tokens: that term is dropped, not fitted negative
    odd = [(100, 1e9, 1.0), (100, 2e9, 0.9), (200, 1e9, 2.0), (300, 5e8, 3.0)]
    fit = LinearForwardPredictor.fit(odd, FL, 30)
    assert fit.seconds_per_flop == 0.0 and fit.seconds_per_token > 0
    with pytest.raises(DualpathError, match="samples"):
        LinearForwardPredictor.fit([(1, 1.0, 1.0), (2, 2.0, 1.0)], FL, 30)


def test_quota_bounds_the_predicted_forward_and_chunks_a_long_prompt() -> None:
    """The quota now caps the whole forward: 300 ms of a 2.5 ms/token model is ~110 tokens, where
    an attention-only line lets the first chunk be thousands of tokens (the minute-long forward)."""
    pred = _line(seconds_per_token=2.5e-3, seconds_per_flop=5e-11, intercept_s=0.03)
    cfg = SchedulerConfig(compute_quota_s=0.3, attention_predictor=pred)
    plan = make_scheduler("dualpath", cfg).plan_prefill_batch(
        BatchView(now_s=0.0, engine_id=0, waiting=(BatchItem(request_id="long", cached_len=0, new_len=8100),))
    )
    (e,) = plan.entries
    assert 50 < e.chunk_len < 110 and plan.attention_s <= 0.3


def test_fresh_first_puts_a_chunked_prompt_behind_requests_not_started() -> None:
    long = BatchItem(request_id="long", cached_len=500, new_len=7600, started=True)
    a = BatchItem(request_id="a", cached_len=0, new_len=4)
    b = BatchItem(request_id="b", cached_len=0, new_len=4)
    assert ordered((long, a, b), "fresh-first") == (a, b, long)
    assert ordered((long, a, b), "fifo") == (long, a, b)
    assert ordered((a, b), "fresh-first") == (a, b)  # nothing started: FIFO (as in the simulator)
    pred = _line(seconds_per_token=2.5e-3, seconds_per_flop=5e-11, intercept_s=0.03)
    for order, first in (("fresh-first", "a"), ("fifo", "long")):
        cfg = SchedulerConfig(compute_quota_s=0.3, attention_predictor=pred, chunk_order=order)
        plan = make_scheduler("dualpath", cfg).plan_prefill_batch(
            BatchView(now_s=0.0, engine_id=0, waiting=(long, a, b))
        )
        assert plan.entries[0].request_id == first
    # fresh-first: both short ones, then what is left of the quota for the long prompt
    cfg = SchedulerConfig(compute_quota_s=0.3, attention_predictor=pred)
    plan = make_scheduler("dualpath", cfg).plan_prefill_batch(
        BatchView(now_s=0.0, engine_id=0, waiting=(long, a, b))
    )
    assert [x.request_id for x in plan.entries] == ["a", "b", "long"]
    assert plan.entries[-1].chunk_len < long.new_len and plan.attention_s <= 0.3
    with pytest.raises(DualpathError, match="chunk_order"):
        SchedulerConfig(chunk_order="lifo")

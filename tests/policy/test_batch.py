"""PE batch formation: compute quota with chunking, token budget (spec section 8)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.core.errors import ConfigError
from dualpath.policy import (
    AttentionFlops,
    BatchItem,
    BatchPlan,
    BatchView,
    LinearAttentionPredictor,
    SchedulerConfig,
    make_scheduler,
)


@st.composite
def predictors(draw: st.DrawFn) -> LinearAttentionPredictor:
    flops = AttentionFlops(
        num_heads=draw(st.integers(1, 16)),
        qk_head_dim=64,
        v_head_dim=64,
        sparse_top_k=draw(st.one_of(st.none(), st.integers(64, 4096))),
    )
    return LinearAttentionPredictor(
        flops_model=flops,
        seconds_per_flop=draw(st.floats(1e-12, 1e-8)),
        intercept_s=draw(st.floats(0.0, 0.4)),
    )


@st.composite
def batch_views(draw: st.DrawFn) -> BatchView:
    items = tuple(
        BatchItem(
            request_id=f"r{i}", cached_len=draw(st.integers(0, 100_000)), new_len=draw(st.integers(1, 4000))
        )
        for i in range(draw(st.integers(0, 12)))
    )
    return BatchView(now_s=0.0, engine_id=3, waiting=items)


def _check_shape(view: BatchView, plan: BatchPlan) -> None:
    assert [e.request_id for e in plan.entries] == [
        i.request_id for i in view.waiting[: len(plan.entries)]
    ], "not a FIFO prefix"
    for k, (entry, item) in enumerate(zip(plan.entries, view.waiting, strict=False)):
        assert entry.cached_len == item.cached_len
        assert 1 <= entry.chunk_len <= item.new_len
        if k < len(plan.entries) - 1:
            assert entry.chunk_len == item.new_len, "only the last entry may be chunked"
    if view.waiting:
        assert plan.entries, "a PE with waiting work must make progress"


@settings(max_examples=80, deadline=None)
@given(batch_views(), predictors(), st.floats(0.01, 1.0))
def test_quota_respected_except_lone_progress(
    view: BatchView, pred: LinearAttentionPredictor, quota: float
) -> None:
    cfg = SchedulerConfig(attention_predictor=pred, compute_quota_s=quota)
    plan = make_scheduler("dualpath", cfg).plan_prefill_batch(view)
    _check_shape(view, plan)
    flops = sum(pred.attention_flops(e.cached_len, e.chunk_len) for e in plan.entries)
    assert plan.attention_s == pytest.approx(pred.predict_s(flops))
    lone = len(plan.entries) == 1 and plan.entries[0].chunk_len == 1
    assert plan.attention_s <= quota or lone
    # maximal: one more token (of the last entry, or of the next request) would break the quota
    if plan.entries:
        last, item = plan.entries[-1], view.waiting[len(plan.entries) - 1]
        if last.chunk_len < item.new_len:
            extra = pred.attention_flops(last.cached_len, last.chunk_len + 1)
            more = flops - pred.attention_flops(last.cached_len, last.chunk_len) + extra
            assert pred.predict_s(more) > quota
        elif len(plan.entries) < len(view.waiting):
            nxt = view.waiting[len(plan.entries)]
            assert pred.predict_s(flops + pred.attention_flops(nxt.cached_len, 1)) > quota


@settings(max_examples=60, deadline=None)
@given(batch_views(), st.integers(1, 5000))
def test_token_budget(view: BatchView, budget: int) -> None:
    plan = make_scheduler("basic", SchedulerConfig(max_batch_tokens=budget)).plan_prefill_batch(view)
    _check_shape(view, plan)
    used = sum(e.chunk_len for e in plan.entries)
    assert used <= budget
    assert used == min(budget, sum(i.new_len for i in view.waiting))
    assert plan.attention_s == 0.0


@settings(max_examples=30, deadline=None)
@given(batch_views(), predictors())
def test_identical_views_identical_batches(view: BatchView, pred: LinearAttentionPredictor) -> None:
    sched = make_scheduler("dualpath", SchedulerConfig(attention_predictor=pred))
    copy = BatchView(now_s=view.now_s, engine_id=view.engine_id, waiting=tuple(view.waiting))
    assert sched.plan_prefill_batch(view) == sched.plan_prefill_batch(copy)


def test_quota_needs_a_predictor() -> None:
    view = BatchView(now_s=0.0, engine_id=0, waiting=(BatchItem(request_id="a", cached_len=0, new_len=1),))
    with pytest.raises(ConfigError, match="attention_predictor"):
        make_scheduler("dualpath").plan_prefill_batch(view)
    cfg = SchedulerConfig(batching="tokens")
    assert make_scheduler("dualpath", cfg).plan_prefill_batch(view).entries[0].chunk_len == 1


def test_chunk_is_largest_fitting() -> None:
    pred = LinearAttentionPredictor(
        flops_model=AttentionFlops(num_heads=1, qk_head_dim=1, v_head_dim=1), seconds_per_flop=1.0
    )
    # 4 flops per (query, key) pair; quota 400 s -> kv pairs <= 100; cached 10: k*10 + k(k+1)/2
    view = BatchView(now_s=0.0, engine_id=0, waiting=(BatchItem(request_id="a", cached_len=10, new_len=50),))
    plan = make_scheduler(
        "dualpath", SchedulerConfig(attention_predictor=pred, compute_quota_s=400)
    ).plan_prefill_batch(view)
    assert plan.entries[0].chunk_len == 7  # 7: 70 + 28 = 98 pairs; 8: 80 + 36 = 116


def test_quota_evens_attention_time_across_a_group() -> None:
    """The point of the quota (spec section 8): GPUs of one attention-DP group that all have work
    get near-equal attention time per step, unlike a plain token budget."""
    import random

    from dualpath.policy import attention_time_balance

    pred = LinearAttentionPredictor(
        flops_model=AttentionFlops(num_heads=128, qk_head_dim=576, v_head_dim=512),
        seconds_per_flop=1 / 400e12,
    )
    rng = random.Random(3)
    views = [
        BatchView(
            now_s=0.0,
            engine_id=g,
            waiting=tuple(
                BatchItem(
                    request_id=f"g{g}r{i}",
                    cached_len=rng.choice([2_000, 60_000]),
                    new_len=rng.randint(100, 3000),
                )
                for i in range(40)
            ),
        )
        for g in range(8)
    ]
    by_mode = {}
    for mode in ("quota", "tokens"):
        cfg = SchedulerConfig(attention_predictor=pred, batching=mode, compute_quota_s=0.3)
        sched = make_scheduler("dualpath", cfg)
        by_mode[mode] = attention_time_balance([[sched.plan_prefill_batch(v).attention_s for v in views]])
    assert by_mode["quota"] < 1.02
    assert by_mode["tokens"] > by_mode["quota"] + 0.05


def test_staging_limit_keeps_the_leading_entries_that_fit() -> None:
    from dualpath.policy.batch import BatchLimits, batch_candidates, fit_staging

    view = BatchView(
        now_s=0.0,
        engine_id=0,
        waiting=tuple(BatchItem(request_id=f"r{i}", cached_len=60, new_len=10) for i in range(5)),
    )
    sched = make_scheduler("basic", SchedulerConfig(max_batch_tokens=1000))
    full = sched.plan_prefill_batch(view)
    limits = BatchLimits(staging_tokens=200, block_size=64)  # each entry pads to 128 rows
    cut = sched.plan_prefill_batch(view, limits)
    assert len(full.entries) == 5 and [e.request_id for e in cut.entries] == ["r0"]
    assert fit_staging(full.entries, BatchLimits(staging_tokens=1, block_size=64)) == full.entries[:1]
    assert fit_staging(full.entries, BatchLimits(staging_tokens=640, block_size=64)) == full.entries
    # the batch offer: refused requests are skipped, the HBM cut stops it, max_items caps it
    sizes = {"a": 50, "b": 30, "c": 40, "d": 10}
    ok = {"a": True, "b": False, "c": True, "d": True}
    assert batch_candidates(sizes, ok.__getitem__, sizes.__getitem__, BatchLimits(hbm_tokens=100)) == [
        "a",
        "c",
        "d",
    ]
    assert batch_candidates(sizes, ok.__getitem__, sizes.__getitem__, BatchLimits(hbm_tokens=60)) == ["a"]
    assert batch_candidates(sizes, ok.__getitem__, sizes.__getitem__, BatchLimits(hbm_tokens=10)) == [
        "a"
    ]  # the first always enters
    assert batch_candidates(sizes, ok.__getitem__, sizes.__getitem__, BatchLimits(max_items=2)) == ["a", "c"]

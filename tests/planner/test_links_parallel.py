"""Links and parallel layouts: EP fraction, TP all-reduce bytes, the AF layer formula, residency,
and the decode grid against the stage work model."""

from __future__ import annotations

import math

import pytest

from dualpath.cost.efficiency import IDEAL_EFFICIENCY
from dualpath.cost.stages import stage_time_s, stage_weight_bytes, stage_work
from dualpath.planner.catalog import npu_catalog
from dualpath.planner.links import (
    N2N_GBS,
    allreduce_bytes,
    collective_s,
    ep_bytes,
    ep_fraction,
    n2n_bytes_per_s,
    n2n_link,
    n2n_transfer,
)
from dualpath.planner.modes import mode_spec
from dualpath.planner.parallel import (
    DECODE_CTX_GRID,
    Layout,
    StageTimer,
    af_layer_s,
    weight_bytes_per_device,
)
from dualpath.planner.pools import AF_PREFILL_RULES, PoolPlan, PoolTimer, UnitTimer
from dualpath.spec.models import get_model

DEV = next(d for d in npu_catalog() if d.name == "npu-2500tf-hbm-190gb")


def test_ep_fraction_is_zero_at_one_and_tends_to_one() -> None:
    assert ep_fraction(1) == 0.0 and ep_bytes(1e9, 1) == 0.0
    values = [ep_fraction(e) for e in (1, 2, 4, 8, 64, 1024, 10**6)]
    assert values == sorted(values) and values[1] == 0.5
    assert 1 - values[-1] < 1e-5


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8])
def test_tp_allreduce_bytes_are_2_t_minus_1_over_t_of_the_message(tp: int) -> None:
    message = 12345.0
    assert allreduce_bytes(message, tp) == pytest.approx(2 * (tp - 1) / tp * message, rel=1e-15)
    assert collective_s("allreduce", message, tp) == pytest.approx(2 * (tp - 1) / tp * message / 3600e9)
    assert collective_s("alltoall", message, tp) == pytest.approx((tp - 1) / tp * message / 3600e9)


def test_n2n_runs_at_min_devices_and_is_fifo() -> None:
    assert n2n_bytes_per_s(4, 16) == 4 * N2N_GBS * 1e9
    link = n2n_link("kv", 2, 8)
    end1 = n2n_transfer(link, 100e9, 0.0)
    end2 = n2n_transfer(link, 100e9, 0.5)  # queues behind the first
    assert end1 == pytest.approx(1.0) and end2 == pytest.approx(2.0)
    assert link.bytes_moved == 200e9


def test_af_layer_is_max_at_two_microbatches_with_free_links_and_sum_at_one() -> None:
    assert af_layer_s(3.0, 5.0, 0.0, 2) == 5.0
    assert af_layer_s(5.0, 3.0, 0.0, 2) == 5.0
    assert af_layer_s(3.0, 5.0, 0.0, 1) == 8.0
    assert af_layer_s(3.0, 5.0, 1.0, 1) == 10.0
    assert af_layer_s(1.0, 1.0, 4.0, 2) == 5.0  # the round trip shared by two
    assert af_layer_s(1.0, 1.0, 4.0, 4) == 4.0  # the link is the slowest server
    assert af_layer_s(3.0, 3.0, 1.0, 2) == 4.0  # (3 + 3 + 2) / 2


def _plan(model, name, stages, tp=1, pp=1, dp=1, ep=None, bits=16, dev=DEV) -> PoolPlan:
    ep = ep if ep is not None else (tp * pp if model.is_moe and any(s in ("pf", "df") for s in stages) else 1)
    return PoolPlan(
        name=name,
        stages=stages,
        device=dev,
        layout=Layout(tp=tp, pp=pp, dp=dp, ep=ep),
        bits=tuple((s, bits) for s in stages),
    )


@pytest.mark.parametrize("af_prefill", AF_PREFILL_RULES)
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_unit_time_reduces_to_max_and_sum_with_free_links(phase: str, af_prefill: str) -> None:
    model = get_model("gpt-oss-120b")
    spec = mode_spec("pdaf")
    plans = {n: _plan(model, n, (n,), tp=2) for n in ("pa", "pf", "da", "df")}
    timers = {n: PoolTimer(model, p, IDEAL_EFFICIENCY) for n, p in plans.items()}
    unit = spec.units[0 if phase == "prefill" else 1]
    free = {"n2n_gbs": 1e30}
    u2 = UnitTimer(model, unit, timers, microbatches=2, af_prefill=af_prefill, **free)
    u1 = UnitTimer(model, unit, timers, microbatches=1, af_prefill=af_prefill, **free)
    it2 = u2.prefill([[3000, 2000]]) if phase == "prefill" else u2.decode(64, 5000.0)
    it1 = u1.prefill([[3000, 2000]]) if phase == "prefill" else u1.decode(64, 5000.0)
    assert it2.a_busy_s > 0 and it2.f_busy_s > 0
    assert it2.time_s == pytest.approx(max(it2.a_busy_s, it2.f_busy_s), rel=1e-9)
    assert it1.time_s == pytest.approx(it1.a_busy_s + it1.f_busy_s, rel=1e-9)
    crossings = model.num_layers
    if phase == "prefill":
        crossings = {"round-trip-per-layer": model.num_layers, "once-per-prompt": 1, "free": 0}[af_prefill]
    assert it2.fwd_bytes == crossings * (5000 if phase == "prefill" else 64) * model.hidden_size * 2


def test_free_af_prefill_charges_no_prefill_n2n_time() -> None:
    """--af-prefill free: a split prefill iteration is af_layer_s(t_A, t_F, 0, m), with no bytes;
    once-per-prompt and round-trip-per-layer charge 1 and L crossings' time (a slow link shows it)."""
    model = get_model("gpt-oss-120b")
    spec = mode_spec("pdaf")
    plans = {n: _plan(model, n, (n,), tp=2) for n in ("pa", "pf", "da", "df")}
    timers = {n: PoolTimer(model, p, IDEAL_EFFICIENCY) for n, p in plans.items()}
    its = {
        rule: UnitTimer(model, spec.units[0], timers, microbatches=2, af_prefill=rule, n2n_gbs=0.05).prefill(
            [[3000, 2000]]
        )
        for rule in AF_PREFILL_RULES
    }
    free = its["free"]
    assert free.fwd_bytes == free.bwd_bytes == 0.0
    assert free.time_s == pytest.approx(af_layer_s(free.a_busy_s, free.f_busy_s, 0.0, 2), rel=1e-12)
    t_x = {r: 5000 * model.hidden_size * 2 / (2 * 0.05e9) for r in AF_PREFILL_RULES}  # one crossing
    once = its["once-per-prompt"]
    assert once.time_s == pytest.approx(af_layer_s(once.a_busy_s, once.f_busy_s, t_x["free"], 2), rel=1e-9)
    per_layer = its["round-trip-per-layer"]
    assert per_layer.time_s == pytest.approx(
        af_layer_s(per_layer.a_busy_s, per_layer.f_busy_s, model.num_layers * t_x["free"], 2), rel=1e-9
    )
    assert free.time_s < once.time_s < per_layer.time_s


def test_merged_stages_add_their_times() -> None:
    model = get_model("gpt-oss-120b")
    spec = mode_spec("pd")
    p = _plan(model, "p", ("pa", "pf"), tp=4)
    unit = UnitTimer(model, spec.units[0], {"p": PoolTimer(model, p, IDEAL_EFFICIENCY)}, microbatches=2)
    timer = PoolTimer(model, p, IDEAL_EFFICIENCY)
    it = unit.prefill([[4000]])
    assert it.time_s == pytest.approx(timer.prefill_s(["pa"], [4000]) + timer.prefill_s(["pf"], [4000]))
    assert it.fwd_bytes == 0.0


def test_residency_shards_non_experts_by_tp_pp_and_experts_by_ep() -> None:
    model = get_model("qwen3-235b-a22b")
    bits = {"pa": 16, "pf": 16, "da": 16, "df": 16}
    a_ne, _ = stage_weight_bytes(model, "pa", 16)
    f_ne, f_ex = stage_weight_bytes(model, "pf", 16)
    got = weight_bytes_per_device(model, bits, 2, 4, 16)
    assert got == pytest.approx((a_ne + f_ne) / 8 + f_ex / 16)
    # PA and DA share their weights: a merged A pool holds one copy (two at two precisions)
    assert weight_bytes_per_device(model, {"pa": 16, "da": 16}, 1, 1, 1) == pytest.approx(a_ne)
    assert weight_bytes_per_device(model, {"pa": 16, "da": 8}, 1, 1, 1) == pytest.approx(1.5 * a_ne)


def _timer(model, stage, tp=1, pp=1) -> StageTimer:
    return StageTimer(
        model=model,
        stage=stage,
        bits=16,
        device=DEV.device,
        tp=tp,
        pp=pp,
        ep=tp * pp if model.is_moe else 1,
        efficiency=IDEAL_EFFICIENCY,
    )


@pytest.mark.parametrize("name", ["qwen3-235b-a22b", "llama-3.1-405b"])
def test_decode_grid_is_exact_for_dense_attention(name: str) -> None:
    model = get_model(name)  # GQA without windows: work is linear in context
    timer = _timer(model, "da", tp=2)
    for ctx in (DECODE_CTX_GRID * 3, DECODE_CTX_GRID * 3 + 17, 100_001):
        exact = timer.lane_s(stage_work(model, "da", batch=32, context_len=ctx), 32)
        assert timer.decode_s(32, float(ctx)) == pytest.approx(exact, rel=1e-9)


def test_tp_and_pp_lane_times() -> None:
    model = get_model("llama-3.1-405b")
    work = stage_work(model, "pa", batch=1, context_len=8192)
    t1 = _timer(model, "pa", 1).lane_s(work, 8192)
    t2 = _timer(model, "pa", 2).lane_s(work, 8192)
    assert t2 < t1  # compute halves; the all-reduce is far smaller
    base = stage_time_s(work, DEV.device)
    assert t1 == pytest.approx(base)
    # PP does not shrink one request's time (it only adds hand-offs)
    assert _timer(model, "pa", 1, 4).lane_s(work, 8192) >= base * (1 - 1e-12)
    assert math.isclose(
        _timer(model, "pa", 2).collectives_s(8192),
        model.num_layers * 8192 * model.hidden_size * 2 / 3600e9,
        rel_tol=1e-12,
    )


def test_pool_wide_ep_shares_the_touched_experts_over_replicas() -> None:
    """With e = t p d a MoE layer serves every replica's tokens: a lane streams
    routed(tokens x d) / d expert bytes, less than its own routed(tokens) (fewer misses)."""
    from dataclasses import replace

    model = get_model("qwen3-235b-a22b")
    local = _timer(model, "df", tp=2)
    shared = replace(local, ep=2 * 8, expert_groups=8, _memo={})
    one = stage_work(model, "df", batch=16, context_len=1)
    pooled = stage_work(model, "df", batch=16 * 8, context_len=1)
    assert pooled.routed_weight_bytes / 8 < one.routed_weight_bytes
    work = shared._shared_experts(one, 16)
    assert work.routed_weight_bytes == pytest.approx(pooled.routed_weight_bytes / 8)
    assert work.weight_bytes == pytest.approx(
        one.weight_bytes - one.routed_weight_bytes + pooled.routed_weight_bytes / 8
    )
    assert shared.decode_s(16, 0.0) < local.decode_s(16, 0.0)
    assert _timer(model, "da", tp=2)._shared_experts(one, 16) is one  # A stages: unchanged

"""The event-driven run: section-5 invariants on small cases, exact N2N byte accounting, KV
backpressure, the closed-form decode segments against step-by-step sums."""

from __future__ import annotations

import math

import pytest

from dualpath.cost.efficiency import IDEAL_EFFICIENCY
from dualpath.cost.stages import hidden_act_bytes_per_token, kv_cache_bytes
from dualpath.planner.catalog import npu_catalog
from dualpath.planner.modes import MODES, mode_spec
from dualpath.planner.parallel import Layout
from dualpath.planner.pools import AF_PREFILL_RULES, Allocation, PoolPlan
from dualpath.planner.run import RunConfig, _Run, simulate
from dualpath.planner.schedule import ND_SCHEDULES
from dualpath.planner.workloads import make_requests
from dualpath.sim.kernel import SimulationError
from dualpath.spec.models import get_model

MODEL = get_model("smollm2-135m")
DEV = next(d for d in npu_catalog() if d.name == "npu-250tf-hbm-16gb")


def make_alloc(
    mode: str, *, dp: int = 2, tp: int = 1, pp: int = 1, bits: int = 16, dev=DEV, model=MODEL
) -> Allocation:
    spec = mode_spec(mode)
    pools = tuple(
        PoolPlan(
            name=p.name,
            stages=p.stages,
            device=dev,
            layout=Layout(tp=tp, pp=pp, dp=dp, ep=1),
            bits=tuple((s, bits) for s in p.stages),
            sigma=1.0,
        )
        for p in spec.pools
    )
    return Allocation(mode=mode, pools=pools, sigma_joint=1.0, cost=sum(p.cost("power_w") for p in pools))


def _reqs(n: int = 30, io: float = 3.0, out: int = 40, **kw):
    return make_requests(num_requests=n, io_ratio=io, output_len=out, rate_rps=125.0, **kw)


@pytest.mark.parametrize("schedule", ND_SCHEDULES)
@pytest.mark.parametrize("af_prefill", AF_PREFILL_RULES)
@pytest.mark.parametrize("mode", MODES)
def test_every_request_finishes_and_n2n_bytes_are_exact(mode: str, af_prefill: str, schedule: str) -> None:
    """Decode crosses the A/F boundary once per layer; prefill per --af-prefill: every layer,
    once, or never (``free``: no prefill N2N bytes at all); under both ND schedules."""
    reqs = _reqs()
    alloc = make_alloc(mode)
    cfg = RunConfig(af_prefill=af_prefill, nd_schedule=schedule)
    res = simulate(MODEL, mode_spec(mode), alloc, reqs, cfg, IDEAL_EFFICIENCY)
    assert res.num_finished == len(reqs)
    act = hidden_act_bytes_per_token(MODEL, 16)
    assert act == MODEL.hidden_size * 2
    kv = sum(kv_cache_bytes(MODEL, i, 16) for i in reqs.input_len)
    crossings = {"round-trip-per-layer": MODEL.num_layers, "once-per-prompt": 1, "free": 0}[af_prefill]
    af = 2 * (crossings * sum(reqs.input_len) + MODEL.num_layers * sum(reqs.output_len)) * act
    expected = {"nd": 0.0, "pd": kv, "af": af, "pdaf": kv + af}[mode]
    assert res.n2n_bytes == pytest.approx(expected, rel=1e-12, abs=0.0)
    assert res.tokens_per_s == pytest.approx(reqs.total_tokens / res.makespan_s)
    assert res.output_tokens_per_s == pytest.approx(sum(reqs.output_len) / res.makespan_s)
    # the run cannot end before the last arrival plus one request's decode
    assert res.makespan_s > reqs.arrival_s[-1]
    assert res.max_kv_used_bytes <= res.kv_capacity_bytes


def test_kv_backpressure_admits_only_what_fits_and_still_finishes() -> None:
    model = get_model("llama-3.1-405b")
    dev = next(d for d in npu_catalog() if d.name == "npu-2500tf-hbm-190gb")
    reqs = _reqs(n=12, io=5000.0, out=30)  # 150k-token prompts: ~77 GB of 16-bit KV each
    alloc = make_alloc("pd", dp=1, tp=8, pp=1, dev=dev, model=model)
    run = _Run(model, mode_spec("pd"), alloc, reqs, RunConfig(), IDEAL_EFFICIENCY)
    res = run.run()
    per_req = kv_cache_bytes(model, max(i + o for i, o in zip(reqs.input_len, reqs.output_len)))
    assert res.kv_capacity_bytes < len(reqs) * per_req  # not everything fits at once
    assert res.max_kv_used_bytes <= res.kv_capacity_bytes
    assert res.num_finished == len(reqs)


def test_a_broken_invariant_fails_the_run() -> None:
    reqs = _reqs(n=5)
    alloc = make_alloc("nd")
    with pytest.raises(SimulationError, match="budget"):
        simulate(MODEL, mode_spec("nd"), alloc, reqs, RunConfig(budget=alloc.cost / 2), IDEAL_EFFICIENCY)


def test_split_pools_run_concurrently_merged_pools_do_not() -> None:
    """PD overlaps prefill with decode; ND runs them one after the other on the same lanes."""
    reqs = _reqs(n=40, io=50.0, out=200)
    nd = simulate(MODEL, mode_spec("nd"), make_alloc("nd", dp=2), reqs, RunConfig(), IDEAL_EFFICIENCY)
    busy = nd.pool_busy_s["nd"]
    assert busy <= nd.makespan_s * (1 + 1e-9)
    pd = simulate(MODEL, mode_spec("pd"), make_alloc("pd", dp=2), reqs, RunConfig(), IDEAL_EFFICIENCY)
    assert pd.pool_busy_s["p"] > 0 and pd.pool_busy_s["d"] > 0
    assert pd.pool_busy_s["p"] + pd.pool_busy_s["d"] > pd.makespan_s * 0.5


def test_segment_sums_equal_step_by_step_sums() -> None:
    model = get_model("qwen3-235b-a22b")
    dev = next(d for d in npu_catalog() if d.name == "npu-2500tf-hbm-190gb")
    reqs = _reqs(n=4, io=1.0, out=10)
    alloc = make_alloc("pd", dp=1, tp=8, dev=dev, model=model)
    run = _Run(model, mode_spec("pd"), alloc, reqs, RunConfig(), IDEAL_EFFICIENCY)
    run.pending = [0, 1, 2]
    run.k.now_s = 0.0
    run._start_decode()
    seg = run.seg
    assert seg is not None and seg.steps == min(reqs.output_len[:3])
    for n in (1, 3, seg.steps):
        stepwise = sum(run.dec.decode(3, seg.ctx_sum / 3 + j).time_s for j in range(n))
        assert run._cum(seg, n)[0] == pytest.approx(stepwise, rel=1e-9)


def test_af_microbatches_change_the_af_run_only() -> None:
    reqs = _reqs(n=10)
    one = simulate(
        MODEL, mode_spec("af"), make_alloc("af"), reqs, RunConfig(af_microbatches=1), IDEAL_EFFICIENCY
    )
    two = simulate(
        MODEL, mode_spec("af"), make_alloc("af"), reqs, RunConfig(af_microbatches=2), IDEAL_EFFICIENCY
    )
    assert two.makespan_s < one.makespan_s
    assert one.n2n_bytes == two.n2n_bytes
    nd1 = simulate(
        MODEL, mode_spec("nd"), make_alloc("nd"), reqs, RunConfig(af_microbatches=1), IDEAL_EFFICIENCY
    )
    nd2 = simulate(MODEL, mode_spec("nd"), make_alloc("nd"), reqs, RunConfig(), IDEAL_EFFICIENCY)
    assert math.isclose(nd1.makespan_s, nd2.makespan_s, rel_tol=1e-12)


def test_link_latency_slows_split_modes() -> None:
    reqs = _reqs(n=10)
    base = simulate(MODEL, mode_spec("pdaf"), make_alloc("pdaf"), reqs, RunConfig(), IDEAL_EFFICIENCY)
    slow = simulate(
        MODEL, mode_spec("pdaf"), make_alloc("pdaf"), reqs, RunConfig(link_latency_s=20e-6), IDEAL_EFFICIENCY
    )
    assert slow.makespan_s > base.makespan_s
    assert slow.n2n_bytes == base.n2n_bytes


@pytest.mark.parametrize("name", ["deepseek-v4-flash", "gpt-oss-120b"])
def test_decode_context_grid_matches_step_by_step_contexts(name: str, monkeypatch) -> None:
    """CSA compression and sliding windows are not linear in context; the 128-token grid the
    segments sum over stays within 1e-4 of reading every step's context exactly (grid 1)."""
    import dualpath.planner.parallel as parallel
    import dualpath.planner.run_decode as run_mod

    model = get_model(name)
    dev = next(d for d in npu_catalog() if d.name == "npu-2500tf-hbm-190gb")
    reqs = _reqs(n=40, io=1.0, out=300)
    alloc = make_alloc("pd", dp=2, tp=8, dev=dev, model=model)
    alloc = Allocation(
        mode="pd",
        pools=tuple(
            PoolPlan(
                name=p.name, stages=p.stages, device=dev, layout=Layout(tp=8, pp=1, dp=2, ep=8), bits=p.bits
            )
            for p in alloc.pools
        ),
        sigma_joint=1.0,
        cost=0.0,
    )
    spans = []
    for grid in (128, 1):
        monkeypatch.setattr(parallel, "DECODE_CTX_GRID", grid)
        monkeypatch.setattr(run_mod, "DECODE_CTX_GRID", grid)
        spans.append(simulate(model, mode_spec("pd"), alloc, reqs, RunConfig(), IDEAL_EFFICIENCY).makespan_s)
    assert spans[0] == pytest.approx(spans[1], rel=1e-4)

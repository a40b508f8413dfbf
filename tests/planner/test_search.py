"""The two-phase search: sigma monotone in demand, one pool's sigma_joint, every allocation within
budget, layout rule and residency (hypothesis), determinism."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dualpath.core.errors import ConfigError
from dualpath.cost.efficiency import IDEAL_EFFICIENCY
from dualpath.cost.stages import kv_cache_bytes
from dualpath.planner.budget import resolve_budget
from dualpath.planner.catalog import gpu_catalog, npu_catalog
from dualpath.planner.modes import MODES, mode_spec
from dualpath.planner.parallel import Layout
from dualpath.planner.pools import PoolPlan
from dualpath.planner.search import Counts, Demand, replica_sigma
from dualpath.planner.search_allocate import phase2
from dualpath.planner.search_shortlist import phase1
from dualpath.spec.models import get_model

ALL16 = {s: (16,) for s in ("pa", "pf", "da", "df")}
MODELS = ("llama-4-scout", "gpt-oss-120b", "qwen3-235b-a22b", "deepseek-v4-flash", "glm-4.6")


def _demand(rate: float = 125.0, i: float = 10_000.0, o: float = 1000.0) -> Demand:
    return Demand(rate_rps=rate, input_len=i, output_len=o, max_context_len=int(1.3 * (i + o)))


def _search(model, devices, kind, budget, mode, demand, shortlist=3, grid=8):
    counts = Counts()
    spec = mode_spec(mode)
    lists = {
        p.name: phase1(
            model,
            p,
            devices,
            demand,
            ALL16,
            budget=budget,
            budget_kind=kind,
            efficiency=IDEAL_EFFICIENCY,
            prefill_token_budget=16384,
            max_decode_batch=512,
            shortlist=shortlist,
            counts=counts,
        )
        for p in spec.pools
    }
    return phase2(spec, lists, budget=budget, grid=grid, counts=counts), counts


@pytest.mark.parametrize("stages", [("pa",), ("df",), ("pa", "pf", "da", "df")])
def test_sigma_is_monotone_in_demand(stages: tuple[str, ...]) -> None:
    model = get_model("gpt-oss-120b")
    dev = next(d for d in npu_catalog() if d.name == "npu-2500tf-hbm-190gb")
    plan = PoolPlan(
        name="x",
        stages=stages,
        device=dev,
        layout=Layout(tp=4, pp=1, dp=1, ep=4),
        bits=tuple((s, 16) for s in stages),
    )
    sig = [
        min(
            replica_sigma(
                model,
                plan,
                _demand(rate=r),
                efficiency=IDEAL_EFFICIENCY,
                prefill_token_budget=16384,
                max_decode_batch=512,
            )
        )
        for r in (10.0, 50.0, 125.0, 500.0)
    ]
    assert all(a > b for a, b in zip(sig, sig[1:]))
    assert sig[0] / sig[-1] == pytest.approx(50.0)  # sigma = d x tput / (lambda x length)


def test_single_pool_sigma_joint_is_its_sigma() -> None:
    model = get_model("gpt-oss-120b")
    devices = npu_catalog()
    budget = resolve_budget(model, devices, "npu", budget_w=None, budget_usd_hr=None, budget_scale=8).value
    ranked, counts = _search(model, devices, "power_w", budget, "nd", _demand())
    assert ranked and counts.allocations_ranked == len(ranked)
    for alloc in ranked:
        assert len(alloc.pools) == 1
        assert alloc.sigma_joint == alloc.pools[0].sigma
    sig = [a.sigma_joint for a in ranked]
    assert sig == sorted(sig, reverse=True)


def _check_alloc(alloc, model, budget, kind, demand) -> None:
    assert alloc.cost <= budget * (1 + 1e-9)
    assert sum(p.cost(kind) for p in alloc.pools) == pytest.approx(alloc.cost)
    for p in alloc.pools:
        lay = p.layout
        assert lay.tp * lay.pp * lay.dp == p.num_devices  # t p d <= N_pool (every device used)
        assert 1 <= lay.ep <= lay.tp * lay.pp * lay.dp
        assert p.weights_per_device(model) <= p.device.device.capacity_bytes
        if "da" in p.stages:
            free = (p.device.device.capacity_bytes - p.weights_per_device(model)) * lay.tp * lay.pp
            assert free >= kv_cache_bytes(model, demand.max_context_len, 16)
    assert alloc.sigma_joint == min(p.sigma for p in alloc.pools)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model_name=st.sampled_from(MODELS),
    gpu=st.booleans(),
    picks=st.lists(st.integers(0, 77), min_size=3, max_size=8, unique=True),
    scale=st.floats(1.0, 64.0),
    mode=st.sampled_from(MODES),
    ratio=st.sampled_from([0.01, 1.0, 100.0]),
)
def test_no_allocation_breaks_budget_layout_or_residency(model_name, gpu, picks, scale, mode, ratio) -> None:
    model = get_model(model_name)
    full = gpu_catalog() if gpu else npu_catalog()
    devices = tuple(full[i % len(full)] for i in sorted(set(i % len(full) for i in picks)))
    kind = "usd_per_hr" if gpu else "power_w"
    try:
        budget = resolve_budget(
            model, devices, "gpu" if gpu else "npu", budget_w=None, budget_usd_hr=None, budget_scale=scale
        ).value
    except ValueError:  # no device of this subset holds the weights
        return
    demand = _demand(i=max(1.0, 1000 * ratio))
    ranked, counts = _search(model, devices, kind, budget, mode, demand)
    assert counts.candidates >= counts.pruned_budget + counts.pruned_residency
    for alloc in ranked:
        _check_alloc(alloc, model, budget, kind, demand)
    keys = [a.key() for a in ranked]
    assert len(keys) == len(set(keys))


@st.composite
def _random_npus(draw) -> tuple:
    """A random catalogue of NPU-like devices (compute, memory family, capacity, bandwidth), each
    with the power model's power."""
    from dualpath.planner.catalog import CatalogDevice
    from dualpath.planner.power import device_power_w
    from dualpath.spec.device import DeviceSpec

    out = []
    for i in range(draw(st.integers(2, 6))):
        tf = draw(st.sampled_from([25.0, 300.0, 2000.0, 15000.0]))
        fam = draw(st.sampled_from(["hbm", "lpddr", "ddr", "gddr"]))
        gb = draw(st.floats(16.0, 1024.0))
        gbs = draw(st.floats(100.0, 9000.0))
        dev = DeviceSpec(
            name=f"rnd{i}", compute_tflops=tf, memory_family=fam, capacity_gb=gb, bandwidth_gbs=gbs
        )
        out.append(
            CatalogDevice(device=dev, kind="npu", usd_per_hr=None, power_w=device_power_w(tf, fam, gb, gbs))
        )
    return tuple(out)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    devices=_random_npus(),
    model_name=st.sampled_from(MODELS),
    scale=st.floats(1.0, 32.0),
    mode=st.sampled_from(MODES),
    kv=st.sampled_from([None, 128, 4096]),
)
def test_random_catalogues_and_ablated_models_keep_every_rule(devices, model_name, scale, mode, kv) -> None:
    from dualpath.planner.ablation import apply_overrides

    base = get_model(model_name)
    model = apply_overrides(base, {"kv_width": kv}) if kv else base
    try:
        budget = resolve_budget(
            base, devices, "npu", budget_w=None, budget_usd_hr=None, budget_scale=scale
        ).value
    except ValueError:
        return
    demand = _demand(i=5000.0)
    ranked, _ = _search(model, devices, "power_w", budget, mode, demand)
    for alloc in ranked:
        _check_alloc(alloc, model, budget, "power_w", demand)


def test_search_is_deterministic() -> None:
    model = get_model("llama-4-scout")
    devices = npu_catalog()
    budget = resolve_budget(model, devices, "npu", budget_w=None, budget_usd_hr=None, budget_scale=16).value
    a, ca = _search(model, devices, "power_w", budget, "pdaf", _demand())
    b, cb = _search(model, devices, "power_w", budget, "pdaf", _demand())
    assert [x.key() for x in a] == [x.key() for x in b] and ca == cb
    assert [x.sigma_joint for x in a] == [x.sigma_joint for x in b]


def test_leftover_budget_goes_to_the_weakest_pool() -> None:
    model = get_model("gpt-oss-120b")
    devices = npu_catalog()
    budget = resolve_budget(model, devices, "npu", budget_w=None, budget_usd_hr=None, budget_scale=32).value
    ranked, _ = _search(model, devices, "power_w", budget, "pd", _demand())
    for alloc in ranked:  # nothing more fits: every pool's replica costs more than what is left
        left = budget - alloc.cost
        assert all(p.cost("power_w") / p.layout.dp > left * (1 - 1e-9) for p in alloc.pools)
        assert not math.isnan(alloc.sigma_joint)


@settings(max_examples=300, deadline=None)
@given(
    pools=st.lists(
        st.tuples(
            st.sampled_from([0.98, 1.67, 3.77, 5.12, 12.29, 121.3, 875.0, 2139.0]),  # replica cost
            st.floats(min_value=1e-4, max_value=2.0, allow_nan=False),  # sigma1
            st.integers(min_value=1, max_value=40),  # starting dp
        ),
        min_size=1,
        max_size=4,
    ),
    leftover=st.floats(min_value=0.0, max_value=5e4, allow_nan=False),
)
def test_fill_matches_the_reference_rule(pools: list[tuple[float, float, int]], leftover: float) -> None:
    """The fast fill hands out exactly the replicas the one-at-a-time rule does (same floats, same
    order), including exact budget ties and leapfrogging near-equal pools."""
    from dualpath.planner.search import Candidate
    from dualpath.planner.search_allocate import _fill

    dev = npu_catalog()[0]
    cands = [
        Candidate(device=dev, tp=1, pp=1, ep=1, bits=(), replica_cost=c, sigma1=s, order=i)
        for i, (c, s, _) in enumerate(pools)
    ]
    fast: list[list[object]] = [[c, d] for c, (_, _, d) in zip(cands, pools, strict=True)]
    ref: list[list[object]] = [list(r) for r in fast]
    _fill(fast, leftover)
    _fill_reference(ref, leftover)
    assert [r[1] for r in fast] == [r[1] for r in ref]
    exact = [[c, d] for c, (_, _, d) in zip(cands, pools, strict=True)]
    _fill(exact, sum(c.replica_cost * 3 for c in cands))  # a leftover that is an exact multiple
    ref2 = [[c, d] for c, (_, _, d) in zip(cands, pools, strict=True)]
    _fill_reference(ref2, sum(c.replica_cost * 3 for c in cands))
    assert [r[1] for r in exact] == [r[1] for r in ref2]


def test_batch_aware_sigma_matches_the_rule_until_the_requests_run_out() -> None:
    """--sigma batch-aware: d x sigma1 while d x b_hold <= C (the run's requests); beyond, the
    batch per replica shrinks, the score is non-decreasing in d and saturates at C sequences."""
    model = get_model("glm-4.6")
    devices = npu_catalog()
    demand = Demand(
        rate_rps=125.0, input_len=1000.0, output_len=1000.0, max_context_len=2600, num_requests=500
    )
    pool = mode_spec("pdaf").pool("df")
    common = dict(
        budget=1e7,
        budget_kind="power_w",
        efficiency=IDEAL_EFFICIENCY,
        prefill_token_budget=16384,
        max_decode_batch=64,
        shortlist=4,
    )
    aware = phase1(model, pool, devices, demand, ALL16, counts=Counts(), sigma_rule="batch-aware", **common)
    c = aware[0][0]
    assert c.curve is not None and c.curve.hold == 64
    full = 500 // 64  # replicas that still see the whole batch
    for d in range(c.min_dp, full + 1):
        assert c.sigma_at(d) == pytest.approx(d * c.sigma1, rel=1e-9)
    scores = [c.sigma_at(d) for d in range(c.min_dp, 2000, 7)]
    assert all(b >= a * (1 - 1e-12) for a, b in zip(scores, scores[1:], strict=False))
    assert c.sigma_at(5000) < 5000 * c.sigma1 / 10  # saturated: most replicas would idle
    with pytest.raises(ConfigError, match="sigma"):
        phase1(model, pool, devices, demand, ALL16, counts=Counts(), sigma_rule="bogus", **common)


def test_batch_aware_search_respects_budget() -> None:
    model = get_model("gpt-oss-120b")
    devices = npu_catalog()
    budget = resolve_budget(model, devices, "npu", budget_w=None, budget_usd_hr=None, budget_scale=64.0).value
    demand = _demand(i=1000.0)
    counts = Counts()
    spec = mode_spec("pdaf")
    lists = {
        p.name: phase1(
            model,
            p,
            devices,
            demand,
            ALL16,
            budget=budget,
            budget_kind="power_w",
            efficiency=IDEAL_EFFICIENCY,
            prefill_token_budget=16384,
            max_decode_batch=512,
            shortlist=3,
            counts=counts,
            sigma_rule="batch-aware",
        )
        for p in spec.pools
    }
    ranked = phase2(spec, lists, budget=budget, grid=8, counts=counts, sigma_rule="batch-aware")
    assert ranked
    for alloc in ranked:
        assert alloc.cost <= budget * (1 + 1e-9)
        assert alloc.sigma_joint == min(p.sigma for p in alloc.pools)


def _fill_reference(chosen: list[list[object]], leftover: float) -> None:
    """The rule as first written (one replica-bulk step per round, lists rebuilt each round)."""
    n = len(chosen)
    unit = [r[0].replica_cost for r in chosen]  # type: ignore[attr-defined]
    while True:
        sig = [r[1] * r[0].sigma1 for r in chosen]  # type: ignore[attr-defined,operator]
        fits = [i for i in range(n) if unit[i] <= leftover * (1 + 1e-12)]
        if not fits:
            return
        i = min(fits, key=lambda j: (sig[j], j))
        c = chosen[i][0]  # type: ignore[assignment]
        room = int(leftover * (1 + 1e-12) // c.replica_cost)
        others = [sig[j] for j in fits if j != i]
        k = room if not others else min(room, int((min(others) - sig[i]) / c.sigma1) + 1)
        k = max(1, k)
        chosen[i][1] = chosen[i][1] + k  # type: ignore[operator]
        leftover -= k * c.replica_cost

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
    return phase2(spec, lists, budget=budget, grid=grid, counts=counts), counts  # largest-batch


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


def _partner_lists(model, demand, budget, mode: str, mdb: int = 512) -> dict:
    spec = mode_spec(mode)
    return {
        p.name: phase1(
            model,
            p,
            npu_catalog(),
            demand,
            ALL16,
            budget=budget,
            budget_kind="power_w",
            efficiency=IDEAL_EFFICIENCY,
            prefill_token_budget=16384,
            max_decode_batch=mdb,
            shortlist=3,
            counts=Counts(),
            sigma_rule="partner-batch",
        )
        for p in spec.pools
    }


def _coupling(mode: str, model, demand, mdb: int = 512, af_prefill: str = "once-per-prompt"):
    from dualpath.planner.links import n2n_bytes_per_s
    from dualpath.planner.pools import af_crossings
    from dualpath.planner.search_fill import Coupling

    return Coupling.of(
        mode_spec(mode),
        concurrency=demand.num_requests,
        max_decode_batch=mdb,
        microbatches=2,
        n2n_bps=n2n_bytes_per_s(1, 1, 50.0),
        latency_s=0.0,
        prefill_crossings=af_crossings(af_prefill, model.num_layers),
        decode_crossings=model.num_layers,
        demand_prefill_tps=demand.prefill_tokens_per_s,
        demand_decode_tps=demand.decode_tokens_per_s,
    )


def test_partner_batch_standalone_decode_saturates_at_the_runs_requests() -> None:
    """Standalone (phase 1, pick): a decode pool of d replicas decodes S = min(C, d b_hold)
    sequences over its p d lanes; the score is non-decreasing in d and flat once every lane has
    one sequence; largest-batch is d x sigma1 for every d."""
    model = get_model("glm-4.6")
    demand = Demand(
        rate_rps=125.0, input_len=1000.0, output_len=1000.0, max_context_len=2600, num_requests=500
    )
    lists = _partner_lists(model, demand, 1e7, "pdaf", mdb=64)
    c = lists["df"][0][0]
    r = c.rater
    assert r is not None and r.hold == 64 and r.concurrency == 500
    for d in (c.min_dp, c.min_dp + 3, 40):
        s = min(500, d * 64)
        t = r.dec_lane_s(math.ceil(s / (r.lanes * d)), d)
        assert c.sigma_at(d) == pytest.approx(s / t / demand.decode_tokens_per_s, rel=1e-12)
    scores = [c.sigma_at(d) for d in range(c.min_dp, 2000, 7)]
    assert all(b >= a * (1 - 1e-9) for a, b in zip(scores, scores[1:], strict=False))
    # past C lanes the batch is one per lane: only the experts' sharing over the pool still moves it
    assert c.sigma_at(8000) < c.sigma_at(4000) * 1.01
    old = phase1(
        model,
        mode_spec("pdaf").pool("df"),
        npu_catalog(),
        demand,
        ALL16,
        budget=1e7,
        budget_kind="power_w",
        efficiency=IDEAL_EFFICIENCY,
        prefill_token_budget=16384,
        max_decode_batch=64,
        shortlist=3,
        counts=Counts(),
        sigma_rule="largest-batch",
    )[0][0]
    assert old.rater is None and old.sigma_at(5000) == 5000 * old.sigma1
    with pytest.raises(ConfigError, match="sigma"):
        phase1(
            model,
            mode_spec("pdaf").pool("df"),
            npu_catalog(),
            demand,
            ALL16,
            budget=1e7,
            budget_kind="power_w",
            efficiency=IDEAL_EFFICIENCY,
            prefill_token_budget=16384,
            max_decode_batch=64,
            shortlist=3,
            counts=Counts(),
            sigma_rule="batch-aware",
        )


def test_split_pf_is_rated_at_the_pa_lanes_tokens() -> None:
    """The defect fix: a split PF replica is rated at one PA lane's tokens per lane (phase 1, both
    rules), never at every token its memory could hold; in an allocation it is rated at the tokens
    the PA lanes hand over, lanes_PA x one lane's tokens, spread over its own lanes."""
    model = get_model("gpt-oss-120b")
    demand = _demand(i=1000.0)  # 1,000-token prompts: a lane takes 16 of them, 16,000 tokens
    lane_tokens = 16 * 1000
    dev = next(d for d in npu_catalog() if d.name == "npu-2500tf-hbm-190gb")
    plan = PoolPlan(
        name="pf", stages=("pf",), device=dev, layout=Layout(tp=2, pp=2, dp=1, ep=4), bits=(("pf", 16),)
    )
    sig = replica_sigma(
        model, plan, demand, efficiency=IDEAL_EFFICIENCY, prefill_token_budget=16384, max_decode_batch=512
    )
    from dualpath.planner.pools import PoolTimer

    t = PoolTimer(model, plan, IDEAL_EFFICIENCY).timers["pf"].prefill_uniform_s(1, lane_tokens)
    assert sig == [pytest.approx(2 * lane_tokens / t / demand.prefill_tokens_per_s, rel=1e-12)]
    lists = _partner_lists(model, demand, 1e6, "pdaf")
    pa, pf = lists["pa"][0][0], lists["pf"][0][0]
    assert pa.rater.pre_lane_tokens == pf.rater.pre_lane_tokens == lane_tokens
    coupling = _coupling("pdaf", model, demand)
    da, df = lists["da"][0][0], lists["df"][0][0]
    for d_pa, d_pf in ((1, 1), (3, 1), (3, 5)):
        dps = [d_pa, d_pf, da.min_dp, df.min_dp]
        got = coupling.sigmas([pa, pf, da, df], dps)
        handed = pa.rater.lanes * d_pa * lane_tokens  # what the PA lanes hand over per iteration
        t_pf = pf.rater.pf_lane_s(math.ceil(handed / (pf.rater.lanes * d_pf)), d_pf)
        assert got[1] == pytest.approx(handed / t_pf / demand.prefill_tokens_per_s, rel=1e-12)
        assert got[0] <= got[1] * (1 + 1e-12)  # PA carries the unit's iteration: never above PF


def test_decode_f_side_is_rated_at_the_sequences_the_kv_side_holds() -> None:
    """DF is rated at S = min(C, d_DA b_hold, slots) over its own lanes; DA at the unit's step at
    that S (so never above DF); growing DA (more KV) raises S and DF's rating with it."""
    model = get_model("glm-4.6")
    demand = _demand(i=20_000.0)  # long contexts: a small DA replica holds few sequences
    lists = _partner_lists(model, demand, 1e7, "pdaf")
    pa, pf, df = lists["pa"][0][0], lists["pf"][0][0], lists["df"][0][0]
    da = min((c for g in lists["da"] for c in g), key=lambda c: c.rater.hold)
    coupling = _coupling("pdaf", model, demand)
    last = 0.0
    for d_da in (da.min_dp, 2 * da.min_dp, 8 * da.min_dp):
        dps = [pa.min_dp, pf.min_dp, d_da, 4 * df.min_dp]
        got = coupling.sigmas([pa, pf, da, df], dps)
        held = min(500, d_da * da.rater.hold, 512 * min(d_da, dps[3]))
        t_f = df.rater.dec_lane_s(math.ceil(held / (df.rater.lanes * dps[3])), dps[3])
        assert got[3] == pytest.approx(held / t_f / demand.decode_tokens_per_s, rel=1e-12)
        assert got[2] <= got[3] * (1 + 1e-12)
        assert got[3] >= last
        last = got[3]


def test_partner_batch_search_keeps_every_rule() -> None:
    """Allocations under partner-batch stay within budget, are rated per pool (joint = min) and
    the leftover ends on a side that still gains; the search is deterministic."""
    model = get_model("gpt-oss-120b")
    budget = resolve_budget(
        model, npu_catalog(), "npu", budget_w=None, budget_usd_hr=None, budget_scale=64.0
    ).value
    demand = _demand(i=1000.0)
    for mode in ("pd", "af", "pdaf"):
        runs = []
        for _ in range(2):
            lists = _partner_lists(model, demand, budget, mode)
            ranked = phase2(
                mode_spec(mode),
                lists,
                budget=budget,
                grid=8,
                counts=Counts(),
                coupling=_coupling(mode, model, demand),
            )
            runs.append([(a.key(), a.sigma_joint) for a in ranked])
            assert ranked
            for alloc in ranked:
                _check_alloc(alloc, model, budget, "power_w", demand)
        assert runs[0] == runs[1]


def test_fill_gives_the_leftover_to_the_side_that_binds() -> None:
    """A split decode unit whose F side binds (its score within 2% of the A side's, which carries
    the unit's step) takes the leftover on the F side; once the A side binds it grows instead."""
    from dualpath.planner.search_fill import BIND_TOL, fill

    model = get_model("glm-4.6")
    demand = _demand(i=1000.0)
    lists = _partner_lists(model, demand, 1e7, "pdaf")
    cands = [lists[p][0][0] for p in ("pa", "pf", "da", "df")]
    coupling = _coupling("pdaf", model, demand)
    start = [c.min_dp for c in cands]
    rows = [[c, d] for c, d in zip(cands, start, strict=True)]
    got = fill(coupling, rows, 200 * max(c.replica_cost for c in cands))
    grown = [r[1] - d for r, d in zip(rows, start, strict=True)]
    assert sum(grown) > 0
    assert got == coupling.sigmas(cands, [r[1] for r in rows])
    for a, f in ((0, 1), (2, 3)):  # every unit ends balanced or A-bound (never F-bound by far)
        assert got[a] <= got[f] * (1 + 1e-12)
    assert BIND_TOL == 0.02


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

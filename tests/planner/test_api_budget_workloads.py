"""plan_disagg's JSON (section 9 keys), budgets, precision parsing and the request lists."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dualpath.core.errors import ConfigError, UnknownNameError
from dualpath.planner.api import plan_disagg
from dualpath.planner.budget import BUDGET_SCALE, cheapest_nd, resolve_budget
from dualpath.planner.catalog import npu_catalog
from dualpath.planner.config import PlanConfig, allowed_precision
from dualpath.planner.stage_profile import stage_profile
from dualpath.planner.workloads import make_requests
from dualpath.spec.models import get_model

TOP = {
    "model",
    "catalog",
    "io_ratio",
    "workload",
    "budget",
    "overrides",
    "precision",
    "modes",
    "best_mode",
    "stage_profile",
    "search",
    "constants",
    "wall_s",
}
MODE = {
    "x_nd",
    "tokens_per_s",
    "output_tokens_per_s",
    "makespan_s",
    "sigma_joint",
    "budget_used",
    "n2n_bytes",
    "pools",
}
POOL = {
    "name",
    "stages",
    "num_devices",
    "tp",
    "pp",
    "dp",
    "ep",
    "precision_bits",
    "sigma",
    "utilization",
    "power_w",
    "usd_per_hr",
    "device",
}
STAGE = {"flops", "weight_bytes", "kv_bytes", "kv_share", "arithmetic_intensity", "bound", "at"}
SMALL = dict(num_requests=40, top_k=2, shortlist=2, grid=4)


@pytest.fixture(scope="module")
def plan() -> dict:
    return plan_disagg(
        PlanConfig(model="gpt-oss-120b", catalog="npu", io_ratio=10.0, budget_scale=16.0, **SMALL)
    )


def test_plan_json_carries_the_section_9_keys(plan: dict) -> None:
    assert TOP <= set(plan)
    assert set(plan["modes"]) == {"nd", "pd", "af", "pdaf"}
    assert {"num_requests", "rate_rps", "input_len", "output_len", "length_cv", "seed"} <= set(
        plan["workload"]
    )
    assert {"kind", "value", "scale", "anchor", "reference_cost"} <= set(plan["budget"])
    assert plan["budget"]["kind"] == "power_w" and plan["budget"]["anchor"] == "weight"
    assert set(plan["stage_profile"]) == {"pa", "pf", "da", "df"}
    for stage in plan["stage_profile"].values():
        assert STAGE <= set(stage) and stage["bound"] in ("compute", "memory")
    assert {
        "top_k",
        "candidates",
        "pruned_budget",
        "pruned_residency",
        "allocations_ranked",
        "simulated",
        "events",
    } <= set(plan["search"])
    assert {"alpha", "p_ref_w", "d2d_gbs", "n2n_gbs", "af_microbatches"} <= set(plan["constants"])
    assert plan["modes"]["nd"]["x_nd"] == 1.0
    best = plan["modes"][plan["best_mode"]]["tokens_per_s"]
    for m in plan["modes"].values():
        assert MODE <= set(m)
        assert m["tokens_per_s"] <= best
        assert m["budget_used"] <= plan["budget"]["value"] * (1 + 1e-9)
        for p in m["pools"]:
            assert POOL <= set(p)
            assert p["num_devices"] == p["tp"] * p["pp"] * p["dp"]
    json.dumps(plan)  # plain JSON


def test_plan_is_deterministic(plan: dict) -> None:
    again = plan_disagg(
        PlanConfig(model="gpt-oss-120b", catalog="npu", io_ratio=10.0, budget_scale=16.0, **SMALL)
    )
    plan = dict(plan)
    assert {**again, "wall_s": 0} == {**plan, "wall_s": 0}


def test_default_budget_ignores_ratio_and_overrides() -> None:
    cfg = dict(
        model="gpt-oss-120b", catalog="npu", num_requests=10, top_k=1, shortlist=1, grid=2, modes=("nd",)
    )
    a = plan_disagg(PlanConfig(io_ratio=1.0, **cfg))["budget"]
    b = plan_disagg(PlanConfig(io_ratio=10.0, overrides={"kv_width": 4096}, **cfg))["budget"]
    assert a == b and a["scale"] == BUDGET_SCALE and a["anchor"] == "weight"
    model = get_model("gpt-oss-120b")
    cost, _ = cheapest_nd(model, npu_catalog(), "power_w")
    assert a["value"] == pytest.approx(BUDGET_SCALE * cost)


def test_explicit_budgets_and_wrong_kinds() -> None:
    model = get_model("gpt-oss-120b")
    b = resolve_budget(model, npu_catalog(), "npu", budget_w=5000.0, budget_usd_hr=None, budget_scale=1.0)
    assert b.value == 5000.0 and b.scale is None
    with pytest.raises(ConfigError, match="budget_usd_hr"):
        resolve_budget(model, npu_catalog(), "npu", budget_w=None, budget_usd_hr=10.0, budget_scale=1.0)
    with pytest.raises(ConfigError, match="no ND deployment"):
        plan_disagg(
            PlanConfig(
                model="gpt-oss-120b", catalog="npu", io_ratio=1.0, budget_w=10.0, num_requests=5, top_k=1
            )
        )


def test_precision_parsing(tmp_path: Path) -> None:
    base = dict(model="gpt-oss-120b", catalog="npu", io_ratio=1.0)
    assert allowed_precision(PlanConfig(**base))["df"] == (16,)
    got = allowed_precision(PlanConfig(precision="16,8,16,4", **base))
    assert got == {"pa": (16,), "pf": (8,), "da": (16,), "df": (4,)}
    for bad in ("12", "16,8", "16,8,16,x"):
        with pytest.raises(ConfigError, match="precision"):
            PlanConfig(precision=bad, **base)
    table = tmp_path / "acc.json"
    table.write_text(json.dumps({"io": {"pf": [16, 8], "df": [16, 8, 4]}}))
    got = allowed_precision(PlanConfig(precision="search", accuracy_table=table, **base))
    assert got["df"] == (16, 8, 4) and got["pa"] == (16,)
    with pytest.raises(ConfigError, match="agentic"):
        PlanConfig(precision="search", accuracy_table=table, workload="agentic", **base)


def test_precision_search_picks_within_the_table(tmp_path: Path) -> None:
    table = tmp_path / "acc.json"
    table.write_text(json.dumps({"default": {"df": [16, 8]}}))
    r = plan_disagg(
        PlanConfig(
            model="gpt-oss-120b",
            catalog="npu",
            io_ratio=1.0,
            precision="search",
            accuracy_table=table,
            budget_scale=8.0,
            modes=("nd", "pdaf"),
            **SMALL,
        )
    )
    assert r["precision"]["df"] in (16, 8) and r["precision"]["pa"] == 16
    for m in r["modes"].values():
        for p in m["pools"]:
            assert set(p["stage_bits"].values()) <= {16, 8}


def test_bad_names_raise() -> None:
    with pytest.raises(UnknownNameError):
        PlanConfig(model="x", catalog="npu", io_ratio=1.0, modes=("nd", "pdq"))
    with pytest.raises(UnknownNameError):
        plan_disagg(PlanConfig(model="no-such-model", catalog="npu", io_ratio=1.0))


def test_stage_profile_objects() -> None:
    prof = stage_profile("glm-4.6", 100.0)
    assert set(prof) == {"pa", "pf", "da", "df"}
    assert prof["da"]["kv_share"] > prof["df"]["kv_share"] == 0.0
    assert prof["pa"]["at"] == {"batch": 1, "context_len": 100_000}
    wide = stage_profile("glm-4.6", 100.0, overrides={"kv_width": 4096})
    assert wide["da"]["kv_share"] > prof["da"]["kv_share"]
    assert wide["da"]["flops"] == prof["da"]["flops"]


def test_requests_are_seeded_clipped_and_evenly_spaced() -> None:
    a = make_requests(num_requests=500, io_ratio=0.001, output_len=1000, seed=3)
    assert a == make_requests(num_requests=500, io_ratio=0.001, output_len=1000, seed=3)
    assert a != make_requests(num_requests=500, io_ratio=0.001, output_len=1000, seed=4)
    assert min(a.input_len) >= 1 and a.arrival_s[1] - a.arrival_s[0] == pytest.approx(0.008)
    b = make_requests(num_requests=500, io_ratio=10.0, output_len=1000)
    assert abs(b.mean_input / 10_000 - 1) < 0.02 and abs(b.mean_output / 1000 - 1) < 0.02
    p = make_requests(num_requests=500, arrivals="poisson")
    assert p.arrival_s == tuple(sorted(p.arrival_s)) and p.arrival_s != b.arrival_s


def test_agentic_turns_reprefill_their_context() -> None:
    r = make_requests(workload="agentic", num_requests=200)
    assert len(r) == 200
    # wave order: the second wave's prompts contain the first wave's whole contexts
    n = 64
    assert all(r.input_len[n + i] > r.input_len[i] + r.output_len[i] for i in range(10))


def test_chatbot_without_data_names_the_env_var(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DUALPATH_DATA_DIR", str(tmp_path / "nothing"))
    with pytest.raises(ConfigError, match="DUALPATH_DATA_DIR"):
        make_requests(workload="chatbot", num_requests=5)


def test_chatbot_reads_the_azure_trace() -> None:
    root = os.environ.get("DUALPATH_DATA_DIR")
    if not root or not (Path(root) / "traces").exists():
        pytest.skip("needs the shared data: set DUALPATH_DATA_DIR")
    r = make_requests(workload="chatbot", num_requests=50)
    assert len(r) == 50 and min(r.input_len) >= 1 and min(r.output_len) >= 1


def test_n2n_and_sigma_options_reach_the_plan() -> None:
    """--n2n-gbs is a documented constant of the JSON and a faster boundary never slows the AF
    split of the same search; --sigma largest-batch is reported and keeps the budget."""
    base = dict(model="gpt-oss-120b", catalog="npu", io_ratio=10.0, num_requests=40, top_k=1)
    slow = plan_disagg(PlanConfig(**base, modes=("nd", "af")))  # type: ignore[arg-type]
    fast = plan_disagg(PlanConfig(**base, modes=("nd", "af"), n2n_gbs=5000.0))  # type: ignore[arg-type]
    assert slow["constants"]["n2n_gbs"] == 50 and fast["constants"]["n2n_gbs"] == 5000.0
    assert fast["modes"]["af"]["makespan_s"] <= slow["modes"]["af"]["makespan_s"] * (1 + 1e-9) or (
        fast["modes"]["af"]["pools"] != slow["modes"]["af"]["pools"]
    )
    old = plan_disagg(PlanConfig(**base, sigma="largest-batch"))  # type: ignore[arg-type]
    assert old["constants"]["sigma"] == "largest-batch" and slow["constants"]["sigma"] == "partner-batch"
    for mode in old["modes"].values():
        assert mode["budget_used"] <= old["budget"]["value"] * (1 + 1e-9)


def test_every_plan_reports_nd_sigma_the_ceiling_and_the_context(plan: dict) -> None:
    """ND's sigma (its simulated allocation's sigma_joint), the arrival-bound ceiling (ND's
    makespan over the arrival window) and the context-window flag are in every plan's JSON."""
    nd = plan["modes"]["nd"]
    assert plan["nd_sigma"] == nd["sigma_joint"] > 0
    assert plan["arrival_window_s"] == pytest.approx((40 - 1) / 125.0)
    assert plan["arrival_bound_ceiling"] == pytest.approx(nd["makespan_s"] / plan["arrival_window_s"])
    ctx = plan["context"]
    assert ctx["window_tokens"] == 131_072 and not ctx["exceeds_window"]  # gpt-oss-120b, I/O 10
    assert 10_000 < ctx["mean_context_len"] < ctx["max_context_len"] < 131_072
    over = plan_disagg(
        PlanConfig(model="qwen3-235b-a22b", catalog="npu", io_ratio=50.0, modes=("nd",), **SMALL)
    )
    assert over["context"]["exceeds_window"] and over["context"]["share_over_window"] > 0.5  # 51k > 40,960


def test_demand_anchor_puts_nd_below_one_at_the_reference_ratio() -> None:
    """--budget-anchor demand: budget = 0.5 x the cheapest ND deployment reaching sigma = 1 at
    I/O 10, the same at every plan ratio (and following the ratio with --budget-ref-io plan)."""
    cfg = dict(model="gpt-oss-120b", catalog="npu", budget_anchor="demand", modes=("nd",), **SMALL)
    at10 = plan_disagg(PlanConfig(io_ratio=10.0, **cfg))  # type: ignore[arg-type]
    b = at10["budget"]
    assert b["anchor"] == "demand" and b["scale"] == 0.5 and b["reference_io"] == 10.0
    assert b["value"] == pytest.approx(0.5 * b["reference_cost"]) and b["anchor_sigma"] >= 1.0
    assert at10["nd_sigma"] < 1.0  # half of what keeping up costs cannot keep up
    at1 = plan_disagg(PlanConfig(io_ratio=1.0, **cfg))  # type: ignore[arg-type]
    assert at1["budget"]["value"] == b["value"]  # fixed across ratios
    own = plan_disagg(PlanConfig(io_ratio=1.0, budget_ref_io="plan", **cfg))  # type: ignore[arg-type]
    assert own["budget"]["reference_io"] == 1.0 and own["budget"]["value"] < b["value"]
    weight = plan_disagg(PlanConfig(io_ratio=10.0, **{**cfg, "budget_anchor": "weight"}))  # type: ignore[arg-type]
    assert weight["budget"]["anchor"] == "weight" and weight["budget"]["value"] != b["value"]
    with pytest.raises(ConfigError, match="budget_anchor"):
        PlanConfig(model="gpt-oss-120b", catalog="npu", io_ratio=1.0, budget_anchor="power")
    with pytest.raises(ConfigError, match="budget_ref_io"):
        PlanConfig(model="gpt-oss-120b", catalog="npu", io_ratio=1.0, budget_ref_io=-2.0)

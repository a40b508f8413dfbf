"""`dualpath plan disagg ...`: every sub-command's JSON carries the documented keys (issue 11,
section 9) and bad input exits 2 with one `error:` line. Small runs (few requests, top-K 1)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from dualpath.cli import app

runner = CliRunner()
SMALL = ["--requests", "20", "--top-k", "1", "--shortlist", "2"]

PLAN_KEYS = {
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
WORKLOAD_KEYS = {"num_requests", "rate_rps", "input_len", "output_len", "length_cv", "seed"}
MODE_KEYS = {
    "x_nd",
    "tokens_per_s",
    "output_tokens_per_s",
    "makespan_s",
    "sigma_joint",
    "budget_used",
    "n2n_bytes",
    "pools",
}
POOL_KEYS = {
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
DEVICE_KEYS = {"name", "kind", "compute_tflops", "memory", "capacity_gb", "bandwidth_gbs"}
STAGE_KEYS = {"flops", "weight_bytes", "kv_bytes", "kv_share", "arithmetic_intensity", "bound", "at"}
SEARCH_KEYS = {"top_k", "candidates", "pruned_budget", "pruned_residency", "allocations_ranked", "simulated"}


def _json(*args: str) -> dict:
    result = runner.invoke(app, ["plan", "disagg", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _check_pool(pool: dict) -> None:
    assert POOL_KEYS <= set(pool), POOL_KEYS - set(pool)
    assert DEVICE_KEYS <= set(pool["device"])
    assert pool["tp"] * pool["pp"] * pool["dp"] <= pool["num_devices"]


def test_plan_json_has_every_section9_key() -> None:
    out = _json("--model", "gpt-oss-120b", "--catalog", "npu", "--io", "10", *SMALL)
    assert PLAN_KEYS <= set(out), PLAN_KEYS - set(out)
    assert WORKLOAD_KEYS <= set(out["workload"])
    assert out["workload"]["num_requests"] == 20
    assert out["workload"]["input_len"] == pytest.approx(10000, rel=0.1)  # mean of drawn lengths
    assert set(out["budget"]) >= {"kind", "value", "scale"} and out["budget"]["kind"] == "power_w"
    assert out["precision"] == {"pa": 16, "pf": 16, "da": 16, "df": 16}
    assert set(out["modes"]) == {"nd", "pd", "af", "pdaf"}
    for rec in out["modes"].values():
        assert MODE_KEYS <= set(rec), MODE_KEYS - set(rec)
        for pool in rec["pools"]:
            _check_pool(pool)
        assert rec["budget_used"] <= out["budget"]["value"] * (1 + 1e-9)
    assert out["modes"]["nd"]["x_nd"] == pytest.approx(1.0)
    assert len(out["modes"]["pdaf"]["pools"]) == 4
    assert out["best_mode"] in out["modes"]
    for stage in ("pa", "pf", "da", "df"):
        assert STAGE_KEYS <= set(out["stage_profile"][stage])
    assert SEARCH_KEYS <= set(out["search"]) and out["search"]["top_k"] == 1
    assert {"alpha", "p_ref_w", "d2d_gbs", "n2n_gbs", "af_microbatches"} <= set(out["constants"])
    assert (
        out["constants"]["sigma"] == "partner-batch" and out["constants"]["af_prefill"] == "once-per-prompt"
    )
    assert out["constants"]["nd_schedule"] == "prefill-first" and out["constants"]["shortlist"] == 2
    assert out["nd_sigma"] == out["modes"]["nd"]["sigma_joint"] and out["arrival_bound_ceiling"] > 0
    assert {"window_tokens", "exceeds_window"} <= set(out["context"])


def test_rule_flags_reach_the_plan() -> None:
    """--af-prefill, --nd-schedule, --budget-anchor, --budget-ref-io, --shortlist and --sigma are
    in the plan's constants and budget; --af-prefill free leaves only decode bytes on the A/F
    boundary (the N2N total of an AF plan is its decode round trips)."""
    out = _json(
        "--model",
        "gpt-oss-120b",
        "--io",
        "10",
        "--mode",
        "nd,af",
        "--af-prefill",
        "free",
        "--nd-schedule",
        "token-budget",
        "--budget-anchor",
        "demand",
        "--budget-ref-io",
        "plan",
        "--sigma",
        "largest-batch",
        *SMALL,
    )
    c = out["constants"]
    assert (c["af_prefill"], c["nd_schedule"], c["sigma"]) == ("free", "token-budget", "largest-batch")
    assert c["shortlist"] == 2 and out["budget"]["anchor"] == "demand"
    assert out["budget"]["reference_io"] == 10.0
    af = out["modes"]["af"]
    outputs = af["output_tokens_per_s"] * af["makespan_s"]  # every request's output tokens
    assert af["af_bytes"] == pytest.approx(af["n2n_bytes"])
    assert af["af_bytes"] == pytest.approx(36 * outputs * 2 * 2880 * 2, rel=1e-9)  # decode only


def test_plan_options_reach_the_config() -> None:
    out = _json(
        "--model",
        "glm-4.6",
        "--catalog",
        "gpu",
        "--io",
        "1",
        "--mode",
        "nd,pd",
        "--set",
        "kv_width=4096",
        "--output-len",
        "200",
        *SMALL,
    )
    assert set(out["modes"]) == {"nd", "pd"} and out["budget"]["kind"] == "usd_per_hr"
    assert out["overrides"] == {"kv_width": 4096.0}
    assert out["workload"]["output_len"] == pytest.approx(200, rel=0.1)
    assert out["workload"]["input_len"] == pytest.approx(200, rel=0.1)
    assert all(p["device"]["kind"] == "gpu" for p in out["modes"]["pd"]["pools"])


def test_issue11_defaults_have_flags() -> None:
    """The budget grid, the prefill token budget and the decode cap (our resolutions of the paper's
    silence) are flags of the plan command, in its constants, and change what it plans."""
    args = ["--model", "gpt-oss-120b", "--io", "1", "--mode", "nd", *SMALL]
    base = _json(*args)
    out = _json(*args, "--grid", "4", "--prefill-token-budget", "512", "--max-decode-batch", "4")
    c = out["constants"]
    assert (c["grid"], c["prefill_token_budget"], c["max_decode_batch"]) == (4, 512, 4)
    assert base["constants"]["max_decode_batch"] == 512
    assert out["modes"]["nd"]["makespan_s"] != base["modes"]["nd"]["makespan_s"]


def test_plan_table_and_out_dir(tmp_path) -> None:
    result = runner.invoke(
        app,
        [
            "plan",
            "disagg",
            "--model",
            "gpt-oss-120b",
            "--io",
            "10",
            "--mode",
            "nd,pd",
            *SMALL,
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "x ND" in result.stdout and "pd" in result.stdout
    assert json.loads((tmp_path / "plan.json").read_text())["model"] == "gpt-oss-120b"


def test_sweep_json_keys() -> None:
    out = _json("sweep", "--catalog", "npu", "--models", "gpt-oss-120b,glm-4.6", "--io", "1,10", *SMALL)
    assert {"catalog", "rows", "model_mean_x_nd", "counts", "allocations"} <= set(out)
    assert len(out["rows"]) == 2 * 2 * 4
    assert {"model", "io_ratio", "mode", "x_nd", "tokens_per_s", "is_best"} <= set(out["rows"][0])
    assert set(out["model_mean_x_nd"]["pdaf"]) == {"1", "10"}
    assert set(out["counts"]["10"]["pd"]) == {"beats_nd", "best", "infeasible"}
    assert sum(c["best"] for c in out["counts"]["10"].values()) == 2  # one best mode per model
    _check_pool(out["allocations"]["10"]["glm-4.6"]["pdaf"][0])
    for model in ("gpt-oss-120b", "glm-4.6"):
        best = [r for r in out["rows"] if r["model"] == model and r["io_ratio"] == 10 and r["is_best"]]
        assert len(best) == 1


def test_ablate_json_keys_and_fixed_budget() -> None:
    out = _json(
        "ablate",
        "--factor",
        "kv_width",
        "--values",
        "128,4096",
        "--models",
        "gpt-oss-120b",
        "--io",
        "10",
        *SMALL,
    )
    assert out["factor"] == "kv_width" and out["io_ratio"] == 10.0
    assert [r["value"] for r in out["rows"]] == [128.0, 4096.0]
    for row in out["rows"]:
        assert {
            "model",
            "value",
            "x_nd",
            "da_arithmetic_intensity",
            "da_kv_share",
            "df_arithmetic_intensity",
            "nd_sigma",
            "arrival_bound_ceiling",
        } <= set(row)
        assert set(row["x_nd"]) == {"pd", "af", "pdaf"}
    lo, hi = out["rows"]
    assert hi["da_kv_share"] > lo["da_kv_share"]  # KV bytes grow, attention FLOPs do not
    assert hi["da_arithmetic_intensity"] < lo["da_arithmetic_intensity"]
    assert lo["budget"]["value"] == hi["budget"]["value"]  # same budget across the ablation


def test_profile_json_keys() -> None:
    out = _json("profile", "--model", "glm-4.6", "--io", "100")
    assert set(out["stages"]) == {"pa", "pf", "da", "df"}
    for st in out["stages"].values():
        assert STAGE_KEYS <= set(st) and st["bound"] in ("memory", "compute")
    wide = _json("profile", "--model", "glm-4.6", "--io", "100", "--set", "kv_width=4096")
    assert wide["stages"]["da"]["kv_share"] > out["stages"]["da"]["kv_share"]
    assert wide["stages"]["da"]["flops"] == out["stages"]["da"]["flops"]


@pytest.mark.parametrize("name", ["npu", "gpu"])
def test_catalog_json_keys(name: str) -> None:
    out = _json("catalog", "--catalog", name)
    assert out["catalog"] == name and out["devices"]
    for dev in out["devices"]:
        assert DEVICE_KEYS | {"power_w", "usd_per_hr"} <= set(dev) and dev["kind"] == name
        assert dev["power_w"] > 0
        assert (dev["usd_per_hr"] is None) == (name == "npu")
    fit = out["power_fit"]
    assert {"alpha", "p_ref_w", "f_ref_tflops", "max_rel_error", "anchors"} <= set(fit)
    assert 0 < fit["alpha"] < 1 and len(fit["anchors"]) == 3
    if name == "npu":
        assert len(out["devices"]) == 6 * 13  # every compute tier x every memory point


BAD = [
    (["--model", "nope", "--io", "1"], "nope"),
    (["--model", "glm-4.6", "--catalog", "tpu", "--io", "1"], "tpu"),
    (["--model", "glm-4.6", "--io", "1", "--mode", "nd,xx"], "xx"),
    (["--model", "glm-4.6", "--io", "1", "--set", "kv_width=abc"], "abc"),
    (["--model", "glm-4.6", "--io", "1", "--set", "bogus_factor=2"], "bogus_factor"),
    (["--model", "glm-4.6", "--io", "-1"], "-1"),
    (["--model", "glm-4.6", "--io", "1", "--budget-w", "1000", "--budget-scale", "2"], "budget"),
    (["--model", "glm-4.6", "--io", "1", "--precision", "16,8"], "16,8"),
    (["--io", "1"], "model"),
    (["sweep", "--io", "1,x"], "x"),
    (["sweep", "--models", "glm-4.6,gpt-9"], "gpt-9"),
    (["ablate", "--factor", "bogus"], "bogus"),
    (["catalog", "--catalog", "tpu"], "tpu"),
    (["--model", "glm-4.6", "--io", "1", "--sigma", "greedy"], "greedy"),
    (["--model", "glm-4.6", "--io", "1", "--n2n-gbs", "0"], "n2n_gbs"),
    (["--model", "glm-4.6", "--io", "1", "--af-prefill", "sometimes"], "sometimes"),
    (["--model", "glm-4.6", "--io", "1", "--nd-schedule", "round-robin"], "round-robin"),
    (["--model", "glm-4.6", "--io", "1", "--budget-anchor", "power"], "power"),
    (["--model", "glm-4.6", "--io", "1", "--budget-ref-io", "-3"], "-3"),
    (["--model", "glm-4.6", "--io", "1", "--budget-ref-io", "ten"], "ten"),
    (["--model", "glm-4.6", "--io", "1", "--shortlist", "0"], "shortlist"),
    (["figures", "--af-prefill", "sometimes"], "sometimes"),
]


@pytest.mark.parametrize(("args", "named"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exits_2_with_one_error_line(args: list[str], named: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "from dualpath.cli import main; main()", "plan", "disagg", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], proc.stderr

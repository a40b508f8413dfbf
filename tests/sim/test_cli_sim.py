from __future__ import annotations

import json

from typer.testing import CliRunner

from dualpath.cli import app


def _json(args: list[str]) -> dict:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_offline_json_has_the_promised_keys(tmp_path) -> None:
    out = _json(["simulate", "--agents", "4", "--system", "basic,oracle", "--json", "--out", str(tmp_path)])
    assert set(out["systems"]) == {"basic", "oracle"}
    for res in out["systems"].values():
        for key in (
            "jct_s",
            "snic_max_over_avg",
            "attn_max_over_avg",
            "bytes",
            "events",
            "wall_s",
            "ttft_breakdown_s",
        ):
            assert key in res
    assert out["systems"]["oracle"]["jct_s"] <= out["systems"]["basic"]["jct_s"]
    assert (tmp_path / "requests_basic.csv").exists() and (tmp_path / "result.json").exists()
    lines = (tmp_path / "requests_oracle.csv").read_text().splitlines()
    assert len(lines) == out["systems"]["oracle"]["num_requests"] + 1


def test_online_json_reports_capacity() -> None:
    out = _json(
        [
            "simulate",
            "--model",
            "ds-27b",
            "--pd",
            "1p1d",
            "--online",
            "--aps",
            "0.05,0.1",
            "--horizon",
            "60",
            "--system",
            "dualpath",
            "--json",
        ]
    )
    sweep = out["systems"]["dualpath"]
    assert "capacity_aps" in sweep and sweep["points"]
    point = sweep["points"][0]
    assert point["ttft_mean_s"] is None or point["ttft_mean_s"] > 0
    assert "ttft_p90_s" in point and "tpot_mean_s" in point


def test_unknown_system_fails_with_choices() -> None:
    result = CliRunner().invoke(app, ["simulate", "--system", "nope", "--json"])
    assert result.exit_code != 0


def test_calibrate_overrides_one_run_and_is_recorded() -> None:
    from dualpath.sim.calibration import DEFAULT_CALIBRATION

    base = _json(["simulate", "--agents", "8", "--system", "basic", "--json"])
    slow = _json(
        [
            "simulate",
            "--agents",
            "8",
            "--system",
            "basic",
            "--json",
            "--calibrate",
            "storage_efficiency=0.1",
            "--calibrate",
            "ep_layer_latency_rdma_s=0.0006",
        ]
    )
    assert base["calibration_overrides"] == {}
    assert base["calibration"] == DEFAULT_CALIBRATION.as_constants()
    assert slow["calibration_overrides"] == {"STORAGE_EFFICIENCY": 0.1, "EP_LAYER_LATENCY_RDMA_S": 0.0006}
    assert slow["calibration"]["STORAGE_EFFICIENCY"] == 0.1
    assert slow["systems"]["basic"]["jct_s"] > base["systems"]["basic"]["jct_s"]
    assert DEFAULT_CALIBRATION.storage_efficiency == 0.5  # the default itself is never changed


def test_calibrate_rejects_unknown_names_and_bad_values() -> None:
    for arg, words in (
        ("NOPE=1", ["NOPE=1", "STORAGE_EFFICIENCY"]),
        ("STORAGE_EFFICIENCY=1.5", ["STORAGE_EFFICIENCY=1.5", "(0.0, 1.0]"]),
        ("PREFILL_EP_NODES=two", ["PREFILL_EP_NODES='two'", "an integer"]),
    ):
        result = CliRunner().invoke(app, ["simulate", "--agents", "2", "--calibrate", arg])
        assert result.exit_code != 0
        message = str(result.exception)  # (`dualpath` prints it as "error: ...", exit code 1)
        assert all(w in message for w in words), message


def test_tie_flags_are_reported_and_bad_values_named() -> None:
    """``--read-tie`` / ``--pe-tie`` (docs/policy.md, "Tie-breaks") reach the run and the JSON;
    absent, the JSON has no such keys (default runs' JSON unchanged); a bad value names itself."""
    base = _json(["simulate", "--agents", "4", "--system", "dualpath", "--json"])
    assert "read_tie" not in base and "pe_tie" not in base
    out = _json(
        [
            "simulate",
            "--agents",
            "4",
            "--system",
            "dualpath",
            "--json",
            "--read-tie",
            "de",
            "--pe-tie",
            "read-queue",
        ]
    )
    assert (out["read_tie"], out["pe_tie"]) == ("de", "read-queue")
    for flag, bad in (("--read-tie", "both"), ("--pe-tie", "coin")):
        result = CliRunner().invoke(app, ["simulate", "--agents", "2", flag, bad])
        assert result.exit_code != 0 and bad in str(result.exception), result.output


def test_pe_fetch_flag_reaches_the_run_and_a_bad_value_is_named() -> None:
    """``--pe-fetch tick`` (the cadence before session 17) is recorded in the JSON and changes the
    run against the default (boundary); a bad value names itself and the choices."""
    args = ["simulate", "--agents", "24", "--system", "dualpath", "--json"]
    base = _json(args)
    assert "pe_fetch" not in base
    tick = _json([*args, "--pe-fetch", "tick"])
    assert tick["pe_fetch"] == "tick"
    a, b = base["systems"]["dualpath"], tick["systems"]["dualpath"]
    assert a["ttft_breakdown_s"]["scheduling"] != b["ttft_breakdown_s"]["scheduling"]
    result = CliRunner().invoke(app, ["simulate", "--agents", "2", "--pe-fetch", "iteration"])
    assert (
        result.exit_code != 0 and "iteration" in str(result.exception) and "boundary" in str(result.exception)
    )

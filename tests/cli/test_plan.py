"""`dualpath plan ...` through typer's CliRunner."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dualpath.cli import app
from dualpath.core.errors import ConfigError, UnknownNameError

runner = CliRunner()


def _json(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_pd_range_json_default_is_paper_node() -> None:
    out = _json("plan", "pd-range")
    assert out["min_p_over_d"] == pytest.approx(1 / 7)
    assert out["max_p_over_d"] == 3.5
    assert out["min_p_over_d_exact"] == "1/7" and out["max_p_over_d_exact"] == "7/2"
    assert "de_dram" in out["binding"]


def test_pd_range_options() -> None:
    out = _json("plan", "pd-range", "--g", "16", "--s", "2", "--dram-gbs", "2000")
    assert out["min_p_over_d_exact"] == "1/7" and out["max_p_over_d_exact"] == "7/2"
    assert out["binding"] == "de_cnic_write"
    out = _json("plan", "pd-range", "--snic-gbps", "200")
    assert out["min_p_over_d_exact"] == "1/15"
    out = _json("plan", "pd-range", "--node", "hopper-8x400", "--g", "4")  # node overrides
    assert out["max_p_over_d_exact"] == "7/2"
    out = _json("plan", "pd-range", "--node", "dgx-a100")  # 200/200 Gbps, M = 409.6 GB/s
    assert out["min_p_over_d_exact"] == "1/7" and out["binding"] == "de_cnic_write"


def test_pd_range_table() -> None:
    result = runner.invoke(app, ["plan", "pd-range"])
    assert result.exit_code == 0 and "7/2" in result.stdout


def test_cache_ratio_json() -> None:
    out = _json(
        "plan",
        "cache-ratio",
        "--model",
        "qwen2.5-32b",
        "--append",
        "429",
        "--context",
        "16k",
        "--context",
        "64K",
    )
    assert out["model"] == "qwen2.5-32b"
    assert [r["context"] for r in out["ratios"]] == [16384, 65536]
    assert out["ratios"][0]["gb_per_pflop"] == pytest.approx(117, rel=0.1)
    assert out["ratios"][1]["gb_per_pflop"] == pytest.approx(267, rel=0.1)
    commas = _json(
        "plan", "cache-ratio", "--model", "qwen2.5-32b", "--context", "16k,32k", "--context", "64k"
    )
    assert [r["context"] for r in commas["ratios"]] == [16384, 32768, 65536]


def test_working_set_json() -> None:
    out = _json(
        "plan",
        "working-set",
        "--model",
        "deepseek-v3.2",
        "--aps",
        "0.45",
        "--mean-jct-s",
        "1100",
        "--mean-total-len",
        "55958",
    )
    assert out["working_set_gb"] == pytest.approx(681, rel=0.15)


def test_trend_json_and_table() -> None:
    out = _json("plan", "trend")
    assert out["io_to_compute_drop_x"] == pytest.approx(14.4, rel=0.01)
    assert [p["dtype"] for p in out["points"]] == ["bf16", "fp8", "fp4"]
    assert runner.invoke(app, ["plan", "trend"]).exit_code == 0


def test_bad_inputs_name_key_and_choices() -> None:
    result = runner.invoke(app, ["plan", "cache-ratio", "--model", "gpt-9", "--json"])
    assert isinstance(result.exception, UnknownNameError)
    assert "gpt-9" in str(result.exception) and "qwen2.5-32b" in str(result.exception)
    result = runner.invoke(app, ["plan", "cache-ratio", "--context", "abc"])
    assert isinstance(result.exception, ConfigError) and "abc" in str(result.exception)
    result = runner.invoke(app, ["plan", "working-set", "--aps", "-1"])
    assert isinstance(result.exception, ConfigError) and "aps=-1" in str(result.exception)


def test_console_entry_reports_error_line_and_exit_code_2() -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from dualpath.cli import main; main()",
            "plan",
            "cache-ratio",
            "--model",
            "nope",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("error: model='nope'") and "deepseek-v3.2" in proc.stderr

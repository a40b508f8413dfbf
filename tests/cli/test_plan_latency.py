"""`dualpath plan latency` through typer's CliRunner: JSON keys, the CSV round trip, a bad row."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from typer.testing import CliRunner

from dualpath.cli import app
from dualpath.cli.plan_latency import CSV_COLUMNS

runner = CliRunner()
AGG = [
    "plan",
    "latency",
    "--model",
    "Qwen/Qwen3-32B",
    "--system",
    "h100_sxm",
    "--backend",
    "trtllm",
    "--precision",
    "fp8",
    "--mode",
    "agg",
    "--isl",
    "4000",
    "--osl",
    "500",
    "--batch",
    "32",
    "--tp",
    "2",
]


def test_json_keys() -> None:
    result = runner.invoke(app, [*AGG, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert {"ttft_ms", "tpot_ms", "breakdown", "source"} <= set(out)
    assert out["ttft_ms"] > 0 and out["tpot_ms"] > 0
    assert {"ttft", "tpot"} <= set(out["breakdown"])
    assert all(isinstance(v, str) and v for v in out["source"].values())


def test_disagg_json() -> None:
    result = runner.invoke(
        app,
        [
            "plan",
            "latency",
            "--model",
            "deepseek-ai/DeepSeek-V3",
            "--system",
            "h200_sxm",
            "--mode",
            "disagg",
            "--isl",
            "2000",
            "--osl",
            "200",
            "--batch",
            "16",
            "--prefill-tp",
            "8",
            "--prefill-workers",
            "1",
            "--prefill-batch",
            "1",
            "--decode-tp",
            "8",
            "--decode-workers",
            "1",
            "--decode-batch",
            "64",
            "--decode-attention-dp",
            "8",
            "--decode-moe-ep",
            "8",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["mode"] == "disagg" and "kv_transfer" in out["breakdown"]["ttft"]


def test_table_output_and_bad_option() -> None:
    result = runner.invoke(app, AGG)
    assert result.exit_code == 0, result.output
    assert "TTFT" in result.stdout and "source" in result.stdout
    bad = runner.invoke(app, [*AGG[:-1], "3"])  # tp 3 does not divide 64 heads
    assert bad.exit_code != 0
    assert "tp=3" in str(bad.exception)


def _row(**kw: object) -> dict[str, object]:
    row: dict[str, object] = {c: "" for c in CSV_COLUMNS}
    row.update(
        model_path="Qwen/Qwen3-32B",
        system="h100_sxm",
        backend="trtllm",
        precision="fp8",
        mode="agg",
        isl=4000,
        osl=500,
        gemm_quant_mode="fp8",
        batch_size=32,
        tp_size=2,
        pp_size=1,
        attention_dp_size=1,
        moe_tp_size=1,
        moe_ep_size=1,
    )
    row.update(kw)
    return row


def test_csv_round_trip_with_a_bad_row(tmp_path: Path) -> None:
    src, dst = tmp_path / "rows.csv", tmp_path / "out" / "pred.csv"
    rows = [
        _row(),
        _row(model_path="acme/NoSuchModel"),
        _row(
            mode="disagg",
            tp_size="",
            batch_size=64,
            prefill_batch_size=1,
            prefill_num_workers=2,
            prefill_tp_size=2,
            decode_batch_size=32,
            decode_num_workers=2,
            decode_tp_size=2,
        ),
        _row(isl="12.5"),
        _row(  # the layout's disagg rows may leave batch sizes and worker counts empty
            mode="disagg",
            tp_size="",
            batch_size="",
            silicon_data_source="db-dump; silicon_concurrency=8; measured=2026",
            prefill_tp_size=2,
            decode_tp_size=2,
        ),
    ]
    with open(src, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[*CSV_COLUMNS, "silicon_data_source", "note"])
        writer.writeheader()
        writer.writerows([{**r, "note": f"row{i}"} for i, r in enumerate(rows)])
    result = runner.invoke(app, ["plan", "latency", "--csv", str(src), "--out", str(dst), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"rows": 5, "errors": 2, "out": str(dst)}
    with open(dst, newline="") as fh:
        reader = csv.DictReader(fh)
        out = list(reader)
        assert reader.fieldnames == [
            *CSV_COLUMNS,
            "silicon_data_source",
            "note",
            "pred_ttft_ms",
            "pred_tpot_ms",
            "assumed",
            "error",
        ]
    assert [r["note"] for r in out] == ["row0", "row1", "row2", "row3", "row4"]
    assert out[0]["error"] == "" and float(out[0]["pred_ttft_ms"]) > 0
    assert float(out[0]["pred_tpot_ms"]) > 0
    assert "acme/NoSuchModel" in out[1]["error"] and out[1]["pred_ttft_ms"] == ""
    assert out[2]["error"] == "" and float(out[2]["pred_tpot_ms"]) > 0
    assert "isl" in out[3]["error"]
    assert out[4]["error"] == "" and float(out[4]["pred_ttft_ms"]) > 0
    assert "concurrency 8 from silicon_data_source" in out[4]["assumed"]
    assert "1 prefill worker" in out[4]["assumed"] and out[0]["assumed"] == ""
    for key in CSV_COLUMNS:  # the input columns come back unchanged
        assert out[0][key] == str(rows[0][key])


def test_csv_needs_out_and_a_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", "latency", "--csv", str(tmp_path / "x.csv")])
    assert result.exit_code != 0 and "--out" in str(result.exception)
    result = runner.invoke(
        app, ["plan", "latency", "--csv", str(tmp_path / "x.csv"), "--out", str(tmp_path / "y.csv")]
    )
    assert result.exit_code != 0 and "no such file" in str(result.exception)

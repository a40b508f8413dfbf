"""benchmarks/plan_latency_accuracy.py on the 30 H100 rows in tests/data (origin in its README):
every row is predicted or refused with one line naming the field, and the table covers each
backend x mode. Bundled kernel slices only (no accuracy asserted: most shapes fall back)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLICE = ROOT / "tests" / "data" / "aiconfigurator" / "silicon_h100_sxm_30.csv"


def _accuracy():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "plan_latency_accuracy", ROOT / "benchmarks" / "plan_latency_accuracy.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_slice_is_h100_only_and_every_row_is_predicted_or_refused_by_field(
    capsys: pytest.CaptureFixture[str],
) -> None:
    acc = _accuracy()
    rows = acc.read_rows(SLICE, "h100_sxm")
    assert len(rows) == 30 and {r["system"] for r in rows} == {"h100_sxm"}
    assert acc.read_rows(SLICE, "h200_sxm") == []
    acc.predict_ours(rows)
    for row in rows:
        if "ours_error" in row:
            assert "\n" not in row["ours_error"] and "=" in row["ours_error"], row["ours_error"]
        else:
            assert row["ours_ttft_ms"] > 0 and row["ours_tpot_ms"] > 0
    covered = sum("ours_error" not in r for r in rows)
    assert covered == 30
    disagg = [r for r in rows if r["mode"] == "disagg"]
    assert disagg and all(r["assumed"] or r["prefill_batch_size"] for r in disagg)
    table = acc.summarize(rows, with_aic=False)
    assert {"trtllm agg (all)", "vllm agg (all)", "sglang agg (all)", "trtllm disagg (all)", "all"} <= set(
        table
    )
    assert table["all"]["rows"] == 30 and table["all"]["ours_ttft_covered"] == 30
    acc.print_table(table, with_aic=False)
    out = capsys.readouterr().out
    assert out.startswith("| group | rows | covered |") and "vllm agg (all)" in out


def test_the_benchmark_cli_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    acc = _accuracy()
    assert acc.main([str(SLICE), "--limit", "3", "--json", "--out", str(tmp_path / "p.csv")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["timing"]["rows"] == 3 and out["table"]["all"]["rows"] == 3
    assert (tmp_path / "p.csv").read_text().count("\n") == 4

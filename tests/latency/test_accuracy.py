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


def test_the_compare_table_puts_both_tools_side_by_side_on_shared_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location(
        "plan_latency_compare", ROOT / "benchmarks" / "plan_latency_compare.py"
    )
    assert spec is not None and spec.loader is not None
    cmp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cmp)
    head = "backend,mode,silicon_ttft_ms,silicon_tpot_ms,ours_ttft_ms,ours_tpot_ms,aic_ttft_ms,aic_tpot_ms"
    lines = [
        "vllm,agg,100,10,110,10.5,150,11",  # ours 10 % / 5 %, AIC 50 % / 10 %
        "vllm,agg,100,10,90,9,,",  # AIC refused: ours only
        "trtllm,disagg,200,20,100,30,260,22",  # ours 50 % / 50 %, AIC 30 % / 10 %
    ]
    path = tmp_path / "p.csv"
    path.write_text("\n".join([head, *lines]) + "\n")
    t = cmp.table(list(__import__("csv").DictReader(path.open())))
    v = t["vllm agg"]
    assert (v["rows"], v["shared"], v["ours_ttft_covered"], v["aic_ttft_covered"]) == (2, 1, 2, 1)
    assert v["ours_ttft_shared"] == pytest.approx(0.10) and v["aic_ttft_shared"] == pytest.approx(0.50)
    assert v["ours_ttft"] == pytest.approx(0.10)  # median of |+10 %| and |-10 %|
    assert "TTFT beats AIC" in cmp.goals(v) and "TPOT beats AIC" in cmp.goals(v)
    assert "TTFT not better than AIC" in cmp.goals(t["trtllm disagg"]) and "TTFT miss" in cmp.goals(
        t["trtllm disagg"]
    )
    assert t["all"]["rows"] == 3 and list(t)[-1] == "all"
    assert cmp.main([str(path)]) == 0
    assert "| vllm agg | 2 |" in capsys.readouterr().out
    (tmp_path / "q.csv").write_text(
        "backend,mode,silicon_ttft_ms,silicon_tpot_ms,ours_ttft_ms,ours_tpot_ms\nvllm,agg,1,1,1,1\n"
    )
    assert cmp.main([str(tmp_path / "q.csv")]) == 1


def test_compare_takes_aic_columns_only_from_the_same_rows(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "plan_latency_compare", ROOT / "benchmarks" / "plan_latency_compare.py"
    )
    assert spec is not None and spec.loader is not None
    cmp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cmp)
    ours = tmp_path / "ours.csv"
    ours.write_text(
        "id,backend,mode,isl,osl,silicon_ttft_ms,silicon_tpot_ms,ours_ttft_ms,ours_tpot_ms\na,vllm,agg,8,8,100,10,110,10\n"
    )
    aic = tmp_path / "aic.csv"
    aic.write_text(
        "id,backend,mode,isl,osl,silicon_ttft_ms,silicon_tpot_ms,aic_ttft_ms,aic_tpot_ms\na,vllm,agg,8,8,100,10,150,12\n"
    )
    other = tmp_path / "other.csv"
    other.write_text(
        "id,backend,mode,isl,osl,silicon_ttft_ms,silicon_tpot_ms,aic_ttft_ms,aic_tpot_ms\nb,vllm,agg,8,8,100,10,150,12\n"
    )
    assert cmp.main([str(ours), "--aic-from", str(aic), "--json"]) == 0
    assert cmp.main([str(ours), "--aic-from", str(other)]) == 1

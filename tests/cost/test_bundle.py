"""The kernel tables the package ships (cost/data/<gpu>_sxm.npz): read with numpy alone, the
same frames as the parquet tables they were built from, the same step times."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from dualpath.core.errors import ConfigError
from dualpath.core.paths import DATA_DIR_ENV
from dualpath.cost import make_cost_model
from dualpath.cost.bundle import BUNDLED_GPUS, build_one
from dualpath.cost.tables import PERF_DB, PerfTables, bundled_path, open_tables
from dualpath.spec.hardware import get_gpu
from dualpath.spec.models import get_model

DS_LENS = [8192] * 16


def _step_s(gpu: str = "h100") -> tuple[float, float, object]:
    cost = make_cost_model("calibrated", get_gpu(gpu), ep_size=16)
    model = get_model("deepseek-v3.2")
    return cost.prefill_iteration_time_s(model, [(0, 4096)]), cost.decode_step_time_s(model, DS_LENS), cost


def _no_pyarrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)


@pytest.mark.parametrize("gpu", BUNDLED_GPUS)
def test_bundle_and_origin_record_cover_the_same_tables(gpu: str) -> None:
    tables = PerfTables(bundled_path(gpu))
    origin = json.loads(bundled_path(gpu).with_suffix(".origin.json").read_text(encoding="utf-8"))
    assert origin["origin_repo"] == "ai-dynamo/aiconfigurator" and origin["license"] == "Apache-2.0"
    names = ["/".join(t) for t in tables.listing()]
    assert names == [t["table"] for t in origin["tables"]] and names
    for entry in origin["tables"]:
        assert len(entry["commit"]) == 40 and len(entry["sha256_prefix"]) == 16, entry
        op, _, _, table = entry["table"].split("/")
        frame = tables.frame(op, table)
        assert frame is not None and len(frame) == entry["rows"]
        assert all(frame[c].dtype != object for c in frame.columns)  # no pickled objects


def test_without_pyarrow_or_data_dir_the_bundle_gives_measured_times(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _no_pyarrow(monkeypatch)
    prefill_s, decode_s, cost = _step_s()
    assert cost.tables.bundled  # type: ignore[attr-defined]
    assert 0 < decode_s < prefill_s
    notes = cost.describe()["coverage"]  # type: ignore[attr-defined]
    assert notes["deepseek-v3.2/moe"].startswith("moe_perf") and "generation_mla_perf" in str(notes)


def test_unbundled_parquet_without_pyarrow_names_the_extra(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / PERF_DB / "gb200").mkdir(parents=True)  # tables there, none bundled
    _no_pyarrow(monkeypatch)
    with pytest.raises(ConfigError, match=r"pip install 'dualpath\[calibrated\]'"):
        open_tables("gb200", tmp_path)
    bundled = open_tables("h100_sxm", tmp_path)  # no H100 tables in the folder: the bundle
    assert bundled.bundled and bundled.origin == "bundled h100_sxm.npz"


@pytest.mark.parametrize("gpu", BUNDLED_GPUS)
def test_bundled_frames_equal_the_parquet_ones(gpu: str, reference_data: Path) -> None:
    parquet = open_tables(gpu, reference_data)
    bundle = PerfTables(bundled_path(gpu))
    assert not parquet.bundled and parquet.listing() == bundle.listing()
    for op, _, _, table in bundle.listing():
        a, b = parquet.frame(op, table), bundle.frame(op, table)
        assert a is not None and b is not None and a.columns == b.columns, table
        for column in a.columns:
            assert a[column].dtype.kind == b[column].dtype.kind, (table, column)
            assert np.array_equal(a[column], b[column]), (table, column)


def test_bundle_step_time_equals_the_parquet_one(monkeypatch, reference_data: Path) -> None:  # type: ignore[no-untyped-def]
    from_parquet = _step_s()
    assert not from_parquet[2].tables.bundled  # type: ignore[attr-defined]
    _no_pyarrow(monkeypatch)
    from_bundle = _step_s()
    assert from_bundle[2].tables.bundled  # type: ignore[attr-defined]
    assert from_bundle[:2] == from_parquet[:2]


def test_the_converter_reproduces_the_shipped_archive(tmp_path: Path, reference_data: Path) -> None:
    archive, count = build_one(reference_data, "h100_sxm", tmp_path)
    built, shipped = PerfTables(archive), PerfTables(bundled_path("h100_sxm"))
    assert count == len(shipped.listing()) and built.listing() == shipped.listing()
    with np.load(archive) as new, np.load(bundled_path("h100_sxm")) as old:
        assert new.files == old.files and all(np.array_equal(new[k], old[k]) for k in new.files)
    manifest = reference_data / "MANIFEST.tsv"
    with manifest.open(encoding="utf-8", newline="") as handle:
        rows = {r["path"]: r for r in csv.DictReader(handle, delimiter="\t")}
    record = json.loads(archive.with_suffix(".origin.json").read_text(encoding="utf-8"))
    first = record["tables"][0]
    rel = (PERF_DB / "h100_sxm" / f"{first['table']}.parquet").as_posix()
    assert first["sha256_prefix"] == rows[rel]["sha256_prefix"]

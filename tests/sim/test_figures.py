from __future__ import annotations

import csv
import json

import pytest

from dualpath.sim.harness.figures import make_figures


def test_pd_ratio_figure_writes_png_and_csv(tmp_path, monkeypatch) -> None:
    import dualpath.sim.harness.figures as figures

    monkeypatch.setattr(figures, "QUICK_AGENTS", 6)
    index = make_figures(str(tmp_path), quick=True, only=["pd_ratio"])
    assert (tmp_path / "pd_ratio.png").stat().st_size > 1000
    rows = list(csv.DictReader(open(tmp_path / "pd_ratio.csv")))
    assert {r["system"] for r in rows} == {"basic", "dualpath"}
    assert all(float(r["jct_s"]) > 0 for r in rows)
    assert json.loads((tmp_path / "index.json").read_text())["files"] == index["files"]


@pytest.mark.slow
def test_all_quick_figures(tmp_path) -> None:
    index = make_figures(str(tmp_path), quick=True)
    assert len([f for f in index["files"] if f.endswith(".png")]) >= 9

"""Power model (planner/power.py), catalogues (planner/catalog.py) and fig_power_fit."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from dualpath.core.errors import ConfigError, UnknownNameError
from dualpath.planner.catalog import (
    GPU_CATALOG,
    NPU_COMPUTE_TIERS_TFLOPS,
    NPU_MEMORY_POINTS,
    catalog,
    catalog_report,
    gpu_catalog,
    load_prices,
    npu_catalog,
)
from dualpath.planner.figures_power import plot_power_fit
from dualpath.planner.power import ANCHORS, device_power_w, memory_power_w, power_fit


def test_power_fit_reproduces_anchor_tdps_within_10_percent() -> None:
    fit = power_fit()
    assert {a.name for a in fit.anchors} == {"a100", "h100", "b200"}
    for a in fit.anchors:
        assert abs(a.modelled_w / a.datasheet_w - 1) < 0.10, a
    assert fit.max_rel_error < 0.10
    assert 0.2 < fit.alpha < 0.8  # sub-linear: FLOPS grow faster than watts
    h100 = next(a for a in ANCHORS if a.name == "h100")
    assert fit.p_ref_w == pytest.approx(700.0 - memory_power_w("hbm", h100.capacity_gb, 3350.0))
    assert fit.f_ref_tflops == 989.0
    doc = fit.to_json()
    assert {"alpha", "p_ref_w", "f_ref_tflops", "max_rel_error", "anchors"} <= set(doc)


def test_power_grows_with_compute_bandwidth_and_capacity() -> None:
    base = device_power_w(250.0, "hbm", 80.0, 3350.0)
    assert device_power_w(2500.0, "hbm", 80.0, 3350.0) > base
    assert device_power_w(250.0, "hbm", 80.0, 8000.0) > base
    assert device_power_w(250.0, "hbm", 190.0, 3350.0) > base
    # per bit, off-chip DDR costs more than HBM; on-chip SRAM is a per-GB estimate (not pJ/bit x
    # bandwidth): its power follows the capacity only
    assert memory_power_w("ddr", 1.0, 1000.0) > memory_power_w("hbm", 1.0, 1000.0)
    assert memory_power_w("sram", 2.0, 150000.0) == memory_power_w("sram", 2.0, 1.0) == 140.0
    assert memory_power_w("sram", 0.23, 80000.0) < memory_power_w("sram", 2.0, 150000.0)
    with pytest.raises(ConfigError, match="memory_family='flash'"):
        memory_power_w("flash", 1.0, 1.0)
    with pytest.raises(ConfigError, match="compute_tflops=0"):
        device_power_w(0, "hbm", 1.0, 1.0)


def test_npu_catalogue_is_every_tier_times_every_point() -> None:
    devices = npu_catalog()
    assert len(devices) == len(NPU_COMPUTE_TIERS_TFLOPS) * len(NPU_MEMORY_POINTS) == 78
    assert len({d.name for d in devices}) == 78
    d = next(d for d in devices if d.name == "npu-25tf-hbm-190gb")
    assert d.to_json() == {
        "name": "npu-25tf-hbm-190gb",
        "kind": "npu",
        "compute_tflops": 25.0,
        "memory": "hbm",
        "capacity_gb": 190.0,
        "bandwidth_gbs": 8000.0,
    }
    assert d.cost("power_w") == d.power_w > 0 and d.usd_per_hr is None
    with pytest.raises(ConfigError, match="no price"):
        d.cost("usd_per_hr")
    assert catalog("npu") == devices


def test_gpu_catalogue_prices_and_override(tmp_path: Path) -> None:
    gpus = gpu_catalog()
    assert tuple(g.name for g in gpus) == GPU_CATALOG
    h100 = gpus[0]
    assert h100.compute_tflops == 989.0 and h100.power_w == 700.0
    assert h100.usd_per_hr == pytest.approx(98.32 / 8)
    assert all(g.usd_per_hr and g.usd_per_hr > 0 for g in gpus)
    assert h100.cost("usd_per_hr") == h100.usd_per_hr
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"h100": 2.0, "t4": 0.1}))
    changed = {g.name: g.usd_per_hr for g in gpu_catalog(path)}
    assert changed["h100"] == 2.0 and changed["t4"] == 0.1
    assert changed["l4"] == load_prices()["l4"]
    path.write_text(json.dumps({"p100": 1.0}))
    with pytest.raises(UnknownNameError, match="p100"):
        gpu_catalog(path)
    path.write_text(json.dumps({"h100": -1}))
    with pytest.raises(ConfigError, match="prices.h100=-1"):
        gpu_catalog(path)
    with pytest.raises(ConfigError, match="file not found"):
        gpu_catalog(tmp_path / "missing.json")
    with pytest.raises(UnknownNameError, match="tpu"):
        catalog("tpu")


@pytest.mark.parametrize("name", ["npu", "gpu"])
def test_catalog_report_keys(name: str) -> None:
    report = catalog_report(name)
    for key in ("catalog", "alpha", "p_ref_w", "fit_max_rel_error", "power_fit", "memory_power", "devices"):
        assert key in report
    assert report["alpha"] == power_fit().alpha
    rows = report["devices"]
    assert isinstance(rows, list) and len(rows) == len(catalog(name))
    assert all(r["power_w"] > 0 for r in rows)
    if name == "gpu":
        assert "date" in report["prices"] and all(r["usd_per_hr"] > 0 for r in rows)
        h100 = rows[0]
        assert h100["modelled_power_w"] == pytest.approx(700.0)
    json.dumps(report)


def test_plot_power_fit_writes_png_and_csv(tmp_path: Path) -> None:
    paths = plot_power_fit(tmp_path)
    assert [p.name for p in paths] == ["fig_power_fit.png", "fig_power_fit.csv"]
    assert paths[0].stat().st_size > 1000
    rows = list(csv.DictReader(paths[1].open()))
    fit_rows = [r for r in rows if r["role"] == "fit"]
    assert len(fit_rows) == 3 and all(abs(float(r["rel_error"])) < 0.10 for r in fit_rows)
    assert {r["gpu"] for r in rows if r["role"] == "catalogue"} == set(GPU_CATALOG)

"""planner/findings.py reads the published findings off sweep/ablate objects (hand-made here)."""

from __future__ import annotations

from dualpath.planner.findings import findings, findings_markdown
from dualpath.planner.report import ratio_key

MODELS = ["m1", "m2", "m3"]


def _sweep(catalog: str, table: dict[float, dict[str, list[float | None]]]) -> dict:
    rows, means = [], {}
    for ratio, modes in table.items():
        best = {m: max(modes, key=lambda k: modes[k][i] or 0) for i, m in enumerate(MODELS)}
        for mode, vals in modes.items():
            for m, v in zip(MODELS, vals, strict=True):
                rows.append(
                    {"model": m, "io_ratio": ratio, "mode": mode, "x_nd": v, "is_best": best[m] == mode}
                )
            ok = [v for v in vals if v is not None]
            means.setdefault(mode, {})[ratio_key(ratio)] = sum(ok) / len(ok) if ok else None
    pool = {
        "stages": ["pa"],
        "device": {
            "name": "h100",
            "compute_tflops": 989,
            "memory": "hbm",
            "capacity_gb": 80,
            "bandwidth_gbs": 3350,
        },
    }
    alloc = {ratio_key(r): {m: {"pdaf": [pool]} for m in MODELS} for r in table}
    regime = {
        ratio_key(r): {
            m: {"nd_sigma": 0.5 + i, "arrival_bound_ceiling": 2.0, "exceeds_window": i == 0}
            for i, m in enumerate(MODELS)
        }
        for r in table
    }
    return {
        "catalog": catalog,
        "models": MODELS,
        "io_ratios": list(table),
        "rows": rows,
        "model_mean_x_nd": means,
        "allocations": alloc,
        "regime": regime,
    }


def _by_id(rows: list[dict]) -> dict[str, dict]:
    return {r["id"]: r for r in rows}


def test_paper_shaped_sweep_comes_out() -> None:
    nd = [1.0, 1.0, 1.0]
    npu = _sweep(
        "npu",
        {
            1.0: {"nd": nd, "pd": [0.8, 0.7, 0.6], "af": [0.3, 0.4, 0.5], "pdaf": [0.5, 0.4, 0.5]},
            10.0: {"nd": nd, "pd": [1.5, 1.2, 1.1], "af": [0.4, 0.5, 0.6], "pdaf": [2.0, 2.2, 2.1]},
            100.0: {"nd": nd, "pd": [1.2, 1.1, 0.9], "af": [0.3, 0.5, 0.6], "pdaf": [1.5, 1.7, 1.8]},
            1000.0: {"nd": nd, "pd": [1.0, 1.1, 1.0], "af": [0.3, 0.5, 0.6], "pdaf": [1.2, 1.3, 1.3]},
        },
    )
    out = _by_id(findings(npu, None, {}))
    assert out["npu_crossover"]["came_out"] and out["npu_crossover"]["fitted"]
    assert out["af_never"]["came_out"]
    assert out["npu_nd_wins_1"]["came_out"]
    assert out["npu_pdaf_beats_100"]["came_out"] and out["npu_pdaf_best_100"]["came_out"]
    assert out["npu_pd_beats_100"]["came_out"]  # 2 of 3 is a majority
    assert not out["npu_allocations_100"]["came_out"]  # an H100 is not a 20k-TF NPU
    assert "| came out |" in findings_markdown(list(out.values()))


def test_misses_and_infeasible_modes_are_reported_as_such() -> None:
    nd = [1.0, 1.0, 1.0]
    gpu = _sweep(
        "gpu",
        {
            0.01: {"nd": nd, "pd": [0.9, 1.3, 1.4], "af": [1.1, 0.5, 0.5], "pdaf": [None, 0.8, 0.9]},
            100.0: {"nd": nd, "pd": [1.0, 1.5, 1.2], "af": [0.5, 0.5, 0.5], "pdaf": [None, 1.6, 1.1]},
        },
    )
    out = _by_id(findings(None, gpu, {}))
    assert not out["af_never"]["came_out"] and "1.10x" in out["af_never"]["ours"]
    assert not out["gpu_pd_beats_0.01"]["came_out"] and out["gpu_pd_beats_0.01"]["ours"].startswith("2/3")
    # m1: PDAF infeasible -> PD wins; m2: 1.5 vs 1.6 is not a tie; m3: PD beats PDAF
    assert out["gpu_pd_ties_pdaf_100"]["ours"] == "2/3"
    assert out["gpu_same_device_100"]["came_out"]


def test_regime_and_io_1000_rows() -> None:
    """ND's sigma at I/O 10 (how many models cannot keep up), and the I/O-1000 PDAF point per
    model with its mean and median and the models whose requests exceed the window marked."""
    nd = [1.0, 1.0, 1.0]
    npu = _sweep(
        "npu",
        {
            10.0: {"nd": nd, "pd": [1.0, 1.0, 1.0], "af": [0.5, 0.5, 0.5], "pdaf": [1.0, 1.0, 1.0]},
            1000.0: {"nd": nd, "pd": [1.0, 1.0, 1.0], "af": [0.5, 0.5, 0.5], "pdaf": [0.5, 0.6, 4.0]},
        },
    )
    out = _by_id(findings(npu, None, {}))
    assert out["npu_nd_keeps_up_10"]["ours"].startswith("ND sigma < 1 for 1/3")
    row = out["npu_pdaf_1000"]
    assert "mean 1.70x, median 0.60x" in row["ours"] and "m1* 0.50" in row["ours"]
    assert row["came_out"] is None

"""`plan disagg figures`: every file listed in index.json exists, each figure wrote its files,
and figures without their data are skipped with a reason naming DUALPATH_DATA_DIR."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dualpath.cli import app
from dualpath.core.paths import data_dir
from dualpath.planner.figures import FIGURES, FigureGrid, make_figures
from dualpath.planner.figures_modes import crossover_io

TINY = FigureGrid(
    models=("gpt-oss-120b",),
    ratios=(10.0,),
    ablation_models=("gpt-oss-120b",),
    ablation_values={"kv_width": (128.0, 4096.0), "active_experts_x": (1.0,)},
    workload_models=("gpt-oss-120b",),
    num_requests=20,
    top_k=1,
    shortlist=2,
    variants=(),
)
HAS_DATA = (data_dir() / "hardware" / "aiconfigurator-perf-db" / "h100_sxm").is_dir()


def _check_index(out: Path, index: dict) -> None:
    assert json.loads((out / "index.json").read_text()) == index
    assert set(index["figures"]) | set(index["skipped"]) == set(FIGURES)
    for name in index["files"]:
        path = Path(name)
        assert path.is_file() and path.stat().st_size > 0, name
    stems = [Path(f).name for f in index["files"]]
    for fig in index["figures"]:
        assert any(s.startswith(fig) for s in stems), fig  # every drawn figure wrote a file
        if fig not in ("table5_allocations",):
            assert any(s.startswith(fig) and s.endswith(".png") for s in stems), fig
    for reason in index["skipped"].values():
        assert "DUALPATH_DATA_DIR" in reason or "data" in reason


def test_tiny_grid_writes_every_listed_file(tmp_path: Path) -> None:
    index = make_figures(tmp_path, grid=TINY)
    _check_index(tmp_path, index)
    assert {
        "table5_allocations_npu.md",
        "table5_allocations_gpu.csv",
        "sweep_npu.json",
        "ablate_kv_width.json",
        "findings.md",
    } <= {Path(f).name for f in index["files"]}
    assert index["grid"]["ratios"] == [10.0, 100.0]  # Table 5's I/O = 100 is always planned
    if not HAS_DATA:
        assert "fig_roofline_vs_measured" in index["skipped"]
    table = (tmp_path / "table5_allocations_npu.md").read_text()
    assert table.count("| gpt-oss-120b |") == 4  # one row per PDAF stage pool
    findings = json.loads((tmp_path / "findings.json").read_text())["findings"]
    assert {"af_never", "npu_pdaf_beats_100", "abl_kv_width", "npu_nd_keeps_up_10"} <= {
        f["id"] for f in findings
    }


def test_findings_under_each_flag(tmp_path: Path) -> None:
    """The figure run rechecks the findings with each rule flag switched (findings_flags.md): one
    column per flag, each cell that flag's own plans (an --af-prefill free run differs from the
    default only where a split prefill unit sends activations)."""
    import dataclasses

    from dualpath.planner.figures_flags import Variant

    grid = dataclasses.replace(
        TINY,
        variants=(
            Variant(
                flag="--af-prefill free",
                overrides={"af_prefill": "free"},
                npu_ratios=(10.0, 100.0),
                gpu_ratios=(),
            ),
            Variant(flag="--shortlist 1", overrides={"shortlist": 1}, npu_ratios=(100.0,), gpu_ratios=()),
        ),
    )
    index = make_figures(tmp_path, grid=grid, only=("fig5_crossover",))
    table = json.loads((tmp_path / "findings_flags.json").read_text())
    assert table["flags"] == ["--af-prefill free", "--shortlist 1"]
    rows = {r["id"]: r for r in table["rows"]}
    assert rows["npu_pdaf_beats_100"]["flags"]["--shortlist 1"] is not None
    assert rows["npu_pdaf_beats_100"]["default"] is None  # the default grid here has no I/O 100
    assert rows["npu_nd_keeps_up_10"]["flags"]["--shortlist 1"] is None  # I/O 10 not planned
    free = json.loads((tmp_path / "flags" / "af_prefill_free_npu.json").read_text())
    assert free["rules"]["af_prefill"] == "free" and free["io_ratios"] == [10.0, 100.0]
    assert "--af-prefill free" in (tmp_path / "findings_flags.md").read_text()
    assert str(tmp_path / "findings_flags.md") in index["files"]


def test_only_and_unknown_figure(tmp_path: Path) -> None:
    from dualpath.core.errors import ConfigError

    index = make_figures(tmp_path, grid=TINY, only=("fig_power_fit",))
    assert index["figures"] == ["fig_power_fit"] and index["plans_run"] == 0
    with pytest.raises(ConfigError, match="fig_nope"):
        make_figures(tmp_path, grid=TINY, only=("fig_nope",))


def test_crossover_interpolates_in_log_io() -> None:
    assert crossover_io([1.0, 10.0, 100.0], [0.5, 1.5, 1.2]) == pytest.approx(10**0.5)
    assert crossover_io([1.0, 10.0], [1.2, 1.5]) is None  # never below parity
    assert crossover_io([1.0, 10.0, 100.0], [0.5, None, 2.0]) == pytest.approx(10 ** (2 / 3))


@pytest.mark.slow
def test_figures_quick_cli(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["plan", "disagg", "figures", "--quick", "--out", str(tmp_path), "--json"]
    )
    assert result.exit_code == 0, result.output
    _check_index(tmp_path, json.loads(result.stdout))


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a hang guard, not the goal (docs/planner.md, "Speed")
def test_figures_full_run(tmp_path: Path) -> None:
    index = make_figures(tmp_path)
    _check_index(tmp_path, index)
    assert len(index["grid"]["models"]) == 8 and len(index["grid"]["ratios"]) == 9


@pytest.mark.slow
def test_jobs_give_the_same_files(tmp_path: Path) -> None:
    """--jobs 2 plans in two processes and writes the same sweeps and findings as one process."""
    import dataclasses

    grid = dataclasses.replace(TINY, ablation_values={"kv_width": (128.0,)})
    only = ("fig5_crossover", "table5_allocations", "fig_ablation")
    make_figures(tmp_path / "one", grid=grid, only=only)
    make_figures(tmp_path / "two", grid=grid, only=only, jobs=2)
    for name in ("sweep_npu.json", "sweep_gpu.json", "ablate_kv_width.json", "findings.json"):
        a, b = (json.loads((tmp_path / d / name).read_text()) for d in ("one", "two"))
        a.pop("wall_s", None), b.pop("wall_s", None)
        assert a == b, name


def test_resume_takes_finished_plans_and_writes_the_same_files(tmp_path: Path) -> None:
    """A run with --resume writes each finished plan; a second run plans nothing and writes the
    same sweeps and findings; a plan stored by other code (another digest folder) is not read."""
    only = ("fig5_crossover", "table5_allocations")
    first = make_figures(tmp_path / "a", grid=TINY, only=only, resume=tmp_path / "store")
    assert first["plans_run"] > 0 and first["plans_resumed"] == 0
    stored = list((tmp_path / "store").glob("*/*.pkl"))
    assert len(stored) == first["plans_run"]
    second = make_figures(tmp_path / "b", grid=TINY, only=only, resume=tmp_path / "store")
    assert second["plans_run"] == 0 and second["plans_resumed"] == first["plans_run"]
    for name in ("sweep_npu.json", "sweep_gpu.json", "findings.json"):
        a, b = (json.loads((tmp_path / d / name).read_text()) for d in ("a", "b"))
        a.pop("wall_s", None), b.pop("wall_s", None)
        assert a == b, name
    other = tmp_path / "store" / "0000000000000000"
    stored[0].parent.rename(other)
    third = make_figures(tmp_path / "c", grid=TINY, only=only, resume=tmp_path / "store")
    assert third["plans_resumed"] == 0 and third["plans_run"] == first["plans_run"]

"""``dualpath plan disagg figures``: every planner plot (docs/planner.md, "Figures"), with CSV and index.

One process and one :class:`~dualpath.planner.report.PlanCache`, so a result needed by several
figures (the I/O = 100 plans feed Figs. 6-7, Table 5 and the roofline gap) is planned once. The
sweeps and ablations are also written as JSON (the ``sweep`` / ``ablate`` objects) and the
published-vs-simulated findings as ``findings.md`` / ``findings.json``. ``quick`` shrinks the grid
(three models, four ratios, fewer requests, top-K 2) so tests run it in minutes.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualpath.core.paths import DATA_DIR_ENV, data_dir
from dualpath.planner import figures_modes as fm
from dualpath.planner import figures_roofline as fr
from dualpath.planner.figures_flags import FLAG_VARIANTS, Variant, flag_markdown, flag_table, run_variants
from dualpath.planner.plan_store import PlanStore
from dualpath.planner.report import (
    ABLATION_MODELS,
    ABLATION_VALUES,
    PAPER_MODELS,
    SWEEP_RATIOS,
    PlanCache,
    ablate,
    sweep,
)

FIGURES = (
    "fig5_crossover",
    "fig6_npu_modes",
    "fig7_gpu_modes",
    "table5_allocations",
    "fig_ablation",
    "fig_roofline_gap",
    "fig_power_fit",
    "fig_roofline_vs_measured",
    "fig_workloads",
)
PANEL_RATIOS = (0.01, 1.0, 100.0)
TABLE_RATIO = 100.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FigureGrid:
    """What the figure run plans. None fields keep PlanConfig's defaults."""

    models: tuple[str, ...] = PAPER_MODELS
    ratios: tuple[float, ...] = SWEEP_RATIOS
    ablation_models: tuple[str, ...] = ABLATION_MODELS
    ablation_values: Mapping[str, tuple[float, ...]] = field(default_factory=lambda: dict(ABLATION_VALUES))
    workload_models: tuple[str, ...] = PAPER_MODELS
    gpu_ratios: tuple[float, ...] | None = None  # None: the NPU ratios
    num_requests: int | None = None
    top_k: int | None = None
    shortlist: int | None = None
    budget_scale: float | None = None
    rules: Mapping[str, Any] = field(default_factory=dict)  # PlanConfig fields for every plan
    variants: tuple[Variant, ...] = FLAG_VARIANTS  # the findings rechecked under each flag

    def base(self, catalog: str, model: str, io_ratio: float):  # -> PlanConfig
        from dualpath.planner.config import PlanConfig

        given: dict[str, Any] = {
            "num_requests": self.num_requests,
            "top_k": self.top_k,
            "shortlist": self.shortlist,
            "budget_scale": self.budget_scale,
            **self.rules,
        }
        return PlanConfig(
            model=model,
            catalog=catalog,  # type: ignore[arg-type]
            io_ratio=io_ratio,
            **{k: v for k, v in given.items() if v is not None},
        )


FULL_GRID = FigureGrid()
QUICK_GRID = FigureGrid(
    models=("gpt-oss-120b", "glm-4.6", "deepseek-v4-flash"),
    ratios=(0.01, 1.0, 10.0, 100.0),
    ablation_models=("deepseek-v4-flash",),
    ablation_values={
        "kv_width": (128.0, 4096.0),
        "active_experts_x": (1.0, 4.0),
        "total_experts_x": (1.0, 4.0),
        "ffn_expansion": (1.0, 4.0),
        "dtype_bytes": (2.0, 1.0),
    },
    workload_models=("gpt-oss-120b",),
    num_requests=100,
    top_k=2,
    shortlist=4,
)


def make_figures(
    out: str | Path,
    *,
    quick: bool = False,
    grid: FigureGrid | None = None,
    only: tuple[str, ...] | None = None,
    progress: Callable[[str], None] | None = None,
    jobs: int = 1,
    resume: str | Path | None = None,
) -> dict:
    """Plan what the figures need, draw them, write index.json; returns the index object.
    ``jobs`` > 1 plans in that many processes first (the same plans, the same results).
    ``resume``: a folder of finished plans (plan_store.py) read before planning and written as
    each plan finishes, so that a stopped run resumes where it was.

    ``only`` limits the run to some of :data:`FIGURES`; a figure whose data are missing is
    listed under ``skipped`` with the reason instead of failing the run.
    """
    from dualpath.core.errors import require

    grid = grid or (QUICK_GRID if quick else FULL_GRID)
    names = tuple(only or FIGURES)
    for name in names:
        require(name in FIGURES, "figure", name, f"unknown figure; choices: {', '.join(FIGURES)}")
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    cache = PlanCache(store=None if resume is None else PlanStore(resume))
    note = progress or (lambda _msg: None)
    files: list[Path] = []
    skipped: dict[str, str] = {}
    sweeps: dict[str, dict] = {}
    ratios = tuple(sorted(set(grid.ratios) | ({TABLE_RATIO} if _wants_table(names) else set())))

    gpu_ratios = (
        ratios
        if grid.gpu_ratios is None
        else tuple(sorted(set(grid.gpu_ratios) | ({TABLE_RATIO} if _wants_table(names) else set())))
    )

    def get_sweep(catalog: str) -> dict:
        if catalog not in sweeps:
            rs = gpu_ratios if catalog == "gpu" else ratios
            base = grid.base(catalog, grid.models[0], rs[0])
            sweeps[catalog] = sweep(base, grid.models, rs, cache=cache, progress=note)
            files.append(_dump(outdir / f"sweep_{catalog}.json", sweeps[catalog]))
        return sweeps[catalog]

    cache.warm(_plan_groups(grid, names, ratios, gpu_ratios, quick), jobs=jobs, progress=note)
    ablations: dict[str, dict] = {}
    if "fig5_crossover" in names:
        files += fm.fig5_crossover(outdir, get_sweep("npu"))
    if "fig6_npu_modes" in names:
        files += fm.fig_modes(outdir, "fig6_npu_modes", get_sweep("npu"), PANEL_RATIOS)
    if "fig7_gpu_modes" in names:
        files += fm.fig_modes(outdir, "fig7_gpu_modes", get_sweep("gpu"), PANEL_RATIOS)
    if "table5_allocations" in names:
        for catalog in ("npu", "gpu"):
            files += fm.table5_allocations(outdir, get_sweep(catalog), TABLE_RATIO)
    if "fig_ablation" in names:
        for factor, values in grid.ablation_values.items():
            base = grid.base("npu", grid.ablation_models[0], TABLE_RATIO)
            ablations[factor] = ablate(
                base, factor, values, grid.ablation_models, io_ratio=TABLE_RATIO, cache=cache, progress=note
            )
            files.append(_dump(outdir / f"ablate_{factor}.json", ablations[factor]))
        files += fm.fig_ablation(outdir, ablations)
    if "fig_roofline_gap" in names:
        panels = {c: {m: cache(grid.base(c, m, TABLE_RATIO)) for m in grid.models} for c in ("npu", "gpu")}
        files += fr.fig_roofline_gap(outdir, panels)
    if "fig_power_fit" in names:
        from dualpath.planner.figures_power import plot_power_fit

        files += [Path(p) for p in plot_power_fit(outdir)]
    data = data_dir()
    if "fig_roofline_vs_measured" in names:
        if importlib.util.find_spec("pyarrow") is None:
            skipped["fig_roofline_vs_measured"] = (
                "reading the kernel tables needs pyarrow: pip install 'dualpath[calibrated]'"
            )
        elif (data / fr.GEMM_TABLE).is_file() and (data / fr.NCCL_TABLE).is_file():
            files += fr.fig_roofline_vs_measured(outdir, data)
        else:
            skipped["fig_roofline_vs_measured"] = (
                f"no H100 GEMM/NCCL tables under {data / fr.GEMM_TABLE.parents[3]} (set {DATA_DIR_ENV})"
            )
    if "fig_workloads" in names:
        files += _workloads(outdir, grid, cache, note, skipped)
    findings_files = _findings(outdir, sweeps, ablations, grid)
    files += findings_files
    if grid.variants and "fig5_crossover" in names:
        files += _flags(outdir, grid, sweeps, ablations, cache, note, quick)
    index = {
        "figures": [n for n in names if n not in skipped],
        "skipped": skipped,
        "files": [str(p) for p in files],
        "quick": quick,
        "grid": {
            "models": list(grid.models),
            "ratios": list(ratios),
            "gpu_ratios": list(gpu_ratios),
            "ablation_models": list(grid.ablation_models),
            "ablation_values": {k: list(v) for k, v in grid.ablation_values.items()},
            "num_requests": grid.num_requests,
            "top_k": grid.top_k,
            "shortlist": grid.shortlist,
            "budget_scale": grid.budget_scale,
            "rules": {k: str(v) for k, v in grid.rules.items()},
            "variants": [v.flag for v in grid.variants],
        },
        "plans_run": cache.calls,
        "plans_resumed": 0 if cache.store is None else cache.store.loaded,
        "plan_wall_s": cache.wall_s,
        "wall_s": time.perf_counter() - started,
    }
    (outdir / "index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
    return index


def _plan_groups(
    grid: FigureGrid,
    names: tuple[str, ...],
    ratios: Sequence[float],
    gpu_ratios: Sequence[float],
    quick: bool,
) -> list[list[Any]]:
    """Every plan the figure run needs, grouped by (catalogue, ratio, model) so that a point's
    rule variants are planned back to back (they share the phase-1 memo); then the ablation and
    workload plans, one group per model."""
    points: dict[tuple[str, float, str], list[Any]] = {}

    def add(catalog: str, ratio: float, model: str, overrides: Mapping[str, Any]) -> None:
        config = dataclasses.replace(grid.base(catalog, model, ratio), **overrides)
        points.setdefault((catalog, ratio, model), []).append(config)

    sweeps = any(
        n in names for n in ("fig5_crossover", "fig6_npu_modes", "fig7_gpu_modes", "table5_allocations")
    )
    if sweeps or "fig_roofline_gap" in names:
        for catalog, rs in (("npu", ratios), ("gpu", gpu_ratios)):
            for r in rs if sweeps else (TABLE_RATIO,):
                for m in grid.models:
                    add(catalog, r, m, {})
    if grid.variants and "fig5_crossover" in names:
        for v in grid.variants:
            for catalog, rs in (("npu", v.npu_ratios), ("gpu", v.gpu_ratios)):
                for r in (x for x in rs if not quick or x in grid.ratios):
                    for m in grid.models:
                        add(catalog, r, m, v.overrides)
    groups = [points[k] for k in sorted(points)]
    if "fig_ablation" in names:
        for m in grid.ablation_models:
            base = grid.base("npu", m, TABLE_RATIO)
            groups.append(
                [
                    dataclasses.replace(base, overrides={factor: float(v)})
                    for factor, values in grid.ablation_values.items()
                    for v in values
                ]
            )
    if "fig_workloads" in names:
        for m in grid.workload_models:
            base = grid.base("npu", m, TABLE_RATIO)
            groups.append(
                [dataclasses.replace(base, workload=k, modes=("nd", "pd")) for k in ("agentic", "chatbot")]
            )
    return groups


def _wants_table(names: tuple[str, ...]) -> bool:
    return any(n in names for n in ("table5_allocations", "fig6_npu_modes", "fig7_gpu_modes"))


def _dump(path: Path, obj: dict) -> Path:
    path.write_text(json.dumps(obj, indent=2, default=str), encoding="utf-8")
    return path


def _workloads(
    out: Path, grid: FigureGrid, cache: PlanCache, note: Callable[[str], None], skipped: dict[str, str]
) -> list[Path]:
    """PD x ND for agentic and chatbot workloads, at each model's I/O = 100 budget and rate."""
    from dualpath.core.errors import ConfigError

    results: dict[str, dict[str, dict]] = {}
    for model in grid.workload_models:
        results[model] = {}
        for kind in ("agentic", "chatbot"):
            base = dataclasses.replace(
                grid.base("npu", model, TABLE_RATIO), workload=kind, modes=("nd", "pd")
            )
            try:
                results[model][kind] = cache(base)
            except ConfigError as exc:  # the chatbot trace needs the shared data
                skipped["fig_workloads"] = f"{kind}: {exc}"
                return []
            note(f"workload {kind} {model}")
    return fm.fig_workloads(out, results)


def _flags(
    out: Path,
    grid: FigureGrid,
    sweeps: dict[str, dict],
    ablations: dict[str, dict],
    cache: PlanCache,
    note: Callable[[str], None],
    quick: bool,
) -> list[Path]:
    """The findings under each flag variant, next to the default's (figures_flags.py)."""
    from dualpath.planner.findings import findings

    default = findings(sweeps.get("npu"), sweeps.get("gpu"), ablations)
    limit = grid.ratios if quick else None
    by_flag = run_variants(out, grid.variants, grid.base, grid.models, cache, note, limit)
    rows = flag_table(default, by_flag)
    flags = [v.flag for v in grid.variants]
    md = out / "findings_flags.md"
    md.write_text(flag_markdown(rows, flags), encoding="utf-8")
    files = [md, _dump(out / "findings_flags.json", {"flags": flags, "rows": rows})]
    return files + sorted((out / "flags").glob("*.json"))


def _findings(out: Path, sweeps: dict[str, dict], ablations: dict[str, dict], grid: FigureGrid) -> list[Path]:
    from dualpath.planner.findings import findings, findings_markdown

    table = findings(sweeps.get("npu"), sweeps.get("gpu"), ablations)
    if not table:
        return []
    md = out / "findings.md"
    md.write_text(findings_markdown(table), encoding="utf-8")
    return [md, _dump(out / "findings.json", {"findings": table})]

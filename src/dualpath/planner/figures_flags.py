"""The findings under each rule flag (docs/planner.md, "Rules"): the same published findings,
rechecked with one rule switched to its alternative.

Each :class:`Variant` names the flag as typed on the command line, the PlanConfig fields it sets,
and the ratios it is planned at: the ratios its findings read (``af-prefill``: the I/O-100 shape
and the crossover; ``nd-schedule``: the low-ratio findings; the K variant: the whole grid, so that
the K sensitivity covers every ratio on both catalogues). Ablations are not rerun per flag. The
figure run writes ``flags/<slug>_<catalog>.json`` (sweep objects) and ``findings_flags.md`` /
``.json``: one row per finding, one column per variant.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualpath.planner.catalog import PRICES_FILE
from dualpath.planner.findings import findings
from dualpath.planner.report import SWEEP_RATIOS, PlanCache, sweep

H100_CUT_PRICES = PRICES_FILE.with_name("gpu_prices_h100_cut.json")
CROSSOVER = (0.01, 1.0, 10.0, 100.0, 1000.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Variant:
    flag: str  # as typed, e.g. "--sigma largest-batch"
    overrides: Mapping[str, Any] = field(default_factory=dict)
    npu_ratios: tuple[float, ...] = CROSSOVER
    gpu_ratios: tuple[float, ...] = (0.01, 100.0)

    @property
    def slug(self) -> str:
        return "".join(ch if ch.isalnum() else "_" for ch in self.flag.strip("-")).strip("_")


FLAG_VARIANTS: tuple[Variant, ...] = (
    Variant(flag="--af-prefill round-trip-per-layer", overrides={"af_prefill": "round-trip-per-layer"}),
    Variant(flag="--af-prefill free", overrides={"af_prefill": "free"}),
    Variant(flag="--sigma largest-batch", overrides={"sigma": "largest-batch"}),
    Variant(flag="--budget-anchor demand", overrides={"budget_anchor": "demand"}),
    Variant(
        flag="--budget-anchor demand --budget-ref-io plan",
        overrides={"budget_anchor": "demand", "budget_ref_io": "plan"},
    ),
    Variant(
        flag="--nd-schedule token-budget",
        overrides={"nd_schedule": "token-budget"},
        npu_ratios=(0.01, 0.1, 1.0, 10.0),
        gpu_ratios=(0.01, 0.1, 1.0),
    ),
    Variant(
        flag="--shortlist 4 --top-k 8",
        overrides={"shortlist": 4, "top_k": 8},
        npu_ratios=SWEEP_RATIOS,
        gpu_ratios=SWEEP_RATIOS,
    ),
    Variant(
        flag="--prices gpu_prices_h100_cut.json",
        overrides={"prices": H100_CUT_PRICES},
        npu_ratios=(),
        gpu_ratios=(0.01, 100.0),
    ),
)


def run_variants(
    out: Path,
    variants: Sequence[Variant],
    base_of: Callable[[str, str, float], Any],
    models: Sequence[str],
    cache: PlanCache,
    note: Callable[[str], None],
    limit: Sequence[float] | None = None,
) -> dict[str, dict[str, dict]]:
    """Plan every variant's sweeps (``limit``: keep only these ratios, for quick grids); returns
    flag -> catalogue -> sweep object, and writes them under ``out/flags``."""
    folder = out / "flags"
    folder.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, dict]] = {}
    for v in variants:
        results[v.flag] = {}
        for catalog, ratios in (("npu", v.npu_ratios), ("gpu", v.gpu_ratios)):
            keep = tuple(r for r in ratios if limit is None or any(abs(r - x) < 1e-12 for x in limit))
            if not keep:
                continue
            base = dataclasses.replace(base_of(catalog, models[0], keep[0]), **v.overrides)
            res = sweep(base, models, keep, cache=cache, progress=lambda m, f=v.flag: note(f"{f}: {m}"))
            results[v.flag][catalog] = res
            path = folder / f"{v.slug}_{catalog}.json"
            path.write_text(json.dumps(res, indent=1, default=str), encoding="utf-8")
    return results


def prewarm(
    plan_sets: Sequence[tuple[str, Sequence[float], Mapping[str, Any]]],
    base_of: Callable[[str, str, float], Any],
    models: Sequence[str],
    cache: PlanCache,
    note: Callable[[str], None],
) -> None:
    """Plan every (catalogue, ratio, model) of ``plan_sets`` ((catalogue, ratios, overrides) each)
    with all its rule variants one after another, so that they share the phase-1 candidates
    memo (search_shortlist.candidates); the sweeps that follow find every plan in ``cache``."""
    from dualpath.core.errors import ConfigError

    points = sorted({(c, r) for c, rs, _ in plan_sets for r in rs})
    for catalog, ratio in points:
        for model in models:
            for cat, rs, overrides in plan_sets:
                if cat != catalog or not any(abs(r - ratio) < 1e-12 for r in rs):
                    continue
                config = dataclasses.replace(base_of(catalog, model, ratio), **overrides)
                try:
                    cache(config)
                except ConfigError as exc:
                    if exc.key != "budget":
                        raise
            note(f"{catalog} {model} I/O={ratio:g}, every rule variant")


def flag_table(default: Sequence[Mapping], by_flag: Mapping[str, Mapping[str, Mapping]]) -> list[dict]:
    """One row per default finding: the default's result and each flag's (None: not planned)."""
    cols = {
        flag: {r["id"]: r for r in findings(s.get("npu"), s.get("gpu"), {})} for flag, s in by_flag.items()
    }
    rows = []
    for r in default:
        cells = {flag: _cell(got.get(r["id"])) for flag, got in cols.items()}
        rows.append(
            {
                "id": r["id"],
                "finding": r["finding"],
                "published": r["published"],
                "default": _cell(r),
                "flags": cells,
            }
        )
    return rows


def _cell(row: Mapping | None) -> dict | None:
    if row is None:
        return None
    return {"ours": row["ours"], "came_out": row["came_out"]}


def flag_markdown(rows: Sequence[Mapping], flags: Sequence[str]) -> str:
    mark = {True: "came out", False: "did not", None: "reported"}
    head = ["finding", "published", "default", *flags]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["default"], *(r["flags"].get(f) for f in flags)]
        text = ["-" if c is None else f"{c['ours']} ({mark[c['came_out']]})" for c in cells]
        lines.append("| " + " | ".join([r["finding"], r["published"], *text]) + " |")
    return "\n".join(lines) + "\n"

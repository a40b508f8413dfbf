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


AF_SHAPE = (1.0, 10.0, 100.0, 1000.0)  # the crossover and the I/O-100 shape

FLAG_VARIANTS: tuple[Variant, ...] = (
    Variant(
        flag="--af-prefill round-trip-per-layer",
        overrides={"af_prefill": "round-trip-per-layer"},
        npu_ratios=AF_SHAPE,
        gpu_ratios=(100.0,),
    ),
    Variant(
        flag="--af-prefill free", overrides={"af_prefill": "free"}, npu_ratios=AF_SHAPE, gpu_ratios=(100.0,)
    ),
    Variant(flag="--sigma largest-batch", overrides={"sigma": "largest-batch"}),
    # the demand anchor's own default scale (0.5), whatever scale the weight-anchored grid sets
    Variant(flag="--budget-anchor demand", overrides={"budget_anchor": "demand", "budget_scale": None}),
    Variant(
        flag="--budget-anchor demand --budget-ref-io plan",
        overrides={"budget_anchor": "demand", "budget_ref_io": "plan", "budget_scale": None},
        npu_ratios=(0.01, 1.0, 100.0, 1000.0),  # at I/O 10 it is the fixed demand anchor
    ),
    Variant(
        flag="--nd-schedule token-budget",
        overrides={"nd_schedule": "token-budget"},
        npu_ratios=(0.01, 0.1, 1.0, 10.0),  # the low-ratio findings
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
            label = v.flag

            def say(m: str, label: str = label) -> None:
                note(f"{label}: {m}")

            res = sweep(base, models, keep, cache=cache, progress=say)
            results[v.flag][catalog] = res
            path = folder / f"{v.slug}_{catalog}.json"
            path.write_text(json.dumps(res, indent=1, default=str), encoding="utf-8")
    return results


def flag_table(default: Sequence[Mapping], by_flag: Mapping[str, Mapping[str, Mapping]]) -> list[dict]:
    """One row per finding (the default's first, then any only a flag's grid reaches): the
    default's result and each flag's (None: not planned)."""
    cols = {
        flag: {r["id"]: r for r in findings(s.get("npu"), s.get("gpu"), {})} for flag, s in by_flag.items()
    }
    known = {r["id"]: r for r in default}
    extra = {r["id"]: r for got in cols.values() for r in got.values() if r["id"] not in known}
    rows = []
    for r in [*default, *extra.values()]:
        cells = {flag: _cell(got.get(r["id"])) for flag, got in cols.items()}
        rows.append(
            {
                "id": r["id"],
                "finding": r["finding"],
                "published": r["published"],
                "default": _cell(known.get(r["id"])),
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

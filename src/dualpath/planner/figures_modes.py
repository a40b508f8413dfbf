"""Plots and tables of the mode comparisons (docs/planner.md, "Figures": Figs. 5-7, Table 5, ablations,
workloads). Each function takes the JSON dicts of ``planner.report`` (or ``plan_disagg``), writes
PNG + CSV (or Markdown + CSV) under ``out`` and returns the paths it wrote. matplotlib is imported
lazily with the Agg backend; nothing here runs the planner.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dualpath.planner.report import ratio_key

MODE_STYLE = {
    "nd": ("#555555", "ND"),
    "pd": ("#1f77b4", "PD"),
    "af": ("#ff7f0e", "AF"),
    "pdaf": ("#2ca02c", "PDAF"),
}
SPLITS = ("pd", "af", "pdaf")
SHORT = {
    "deepseek-v4-pro": "DS-V4-Pro",
    "deepseek-v4-flash": "DS-V4-Flash",
    "llama-3.1-405b": "Llama-3.1-405B",
    "llama-4-maverick": "Llama-4-Mav.",
    "llama-4-scout": "Llama-4-Scout",
    "glm-4.6": "GLM-4.6",
    "gpt-oss-120b": "GPT-OSS-120B",
    "qwen3-235b-a22b": "Qwen3-235B",
}


def plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt().close(fig)
    return path


def _x_nd(sweep: Mapping, model: str, ratio: float, mode: str) -> float | None:
    for row in sweep["rows"]:
        if row["model"] == model and row["mode"] == mode and math.isclose(row["io_ratio"], ratio):
            return row["x_nd"]
    return None


def crossover_io(ratios: Sequence[float], values: Sequence[float | None]) -> float | None:
    """First I/O where the curve rises through 1.0, interpolated in log I/O (None if never)."""
    pts = [(r, v) for r, v in zip(ratios, values, strict=True) if v is not None]
    for (r0, v0), (r1, v1) in zip(pts, pts[1:], strict=False):
        if v0 < 1.0 <= v1:
            frac = (1.0 - v0) / (v1 - v0)
            return 10 ** (math.log10(r0) + frac * (math.log10(r1) - math.log10(r0)))
    return None


def fig5_crossover(out: Path, sweep: Mapping) -> list[Path]:
    """Model-mean PDAF x ND against I/O (log x), parity line, the crossover decade shaded."""
    means = sweep["model_mean_x_nd"]
    ratios = sorted(float(k) for k in means.get("pdaf", {}))
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(7, 4.2))
    for mode in ("pd", "af", "pdaf"):
        if mode not in means:
            continue
        ys = [means[mode].get(ratio_key(r)) for r in ratios]
        color, label = MODE_STYLE[mode]
        strong = mode == "pdaf"
        ax.plot(
            ratios,
            ys,
            marker="o",
            color=color,
            label=f"{label} (model mean)",
            lw=2.2 if strong else 1.0,
            alpha=1.0 if strong else 0.45,
            ms=6 if strong else 4,
        )
        if strong:
            for r, y in zip(ratios, ys, strict=True):
                if y is not None:
                    ax.annotate(
                        f"{y:.2f}",
                        (r, y),
                        textcoords="offset points",
                        xytext=(0, 7),
                        ha="center",
                        fontsize=8,
                        color=color,
                    )
    medians = sweep.get("model_median_x_nd", {}).get("pdaf", {})
    if medians:
        ax.plot(
            ratios,
            [medians.get(ratio_key(r)) for r in ratios],
            ls=":",
            marker=".",
            color=MODE_STYLE["pdaf"][0],
            label="PDAF (model median)",
        )
    ax.axhline(1.0, color="black", ls="--", lw=1, label="parity with ND")
    if sweep["catalog"] == "npu":  # the paper's Fig. 5 values (the budget_scale fit's target)
        from dualpath.planner.calibrate import PLATEAU_BAND, PLATEAU_RATIOS, POINT_TARGETS

        ax.scatter(
            list(POINT_TARGETS),
            list(POINT_TARGETS.values()),
            marker="x",
            color="black",
            zorder=4,
            label="published PDAF (paper Fig. 5)",
        )
        ax.fill_between(
            [min(PLATEAU_RATIOS), max(PLATEAU_RATIOS)],
            *PLATEAU_BAND,
            color="black",
            alpha=0.07,
            label="published plateau 1.5-1.8x",
        )
    cross = crossover_io(ratios, [means.get("pdaf", {}).get(ratio_key(r)) for r in ratios])
    if cross is not None:
        lo = 10 ** math.floor(math.log10(cross))
        ax.axvspan(
            lo,
            lo * 10,
            color="#2ca02c",
            alpha=0.08,
            label=f"crossover decade (PDAF = ND at I/O ~ {cross:.3g})",
        )
    ax.set_xscale("log")
    ax.set_xlabel("input / output length ratio (I/O)")
    ax.set_ylabel("throughput x ND (model mean)")
    ax.set_title(f"PDAF vs ND across I/O ({sweep['catalog'].upper()}, {len(sweep['models'])} models)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="best")
    rows = [
        [
            r,
            *(means.get(m, {}).get(ratio_key(r)) for m in ("nd", "pd", "af", "pdaf")),
            medians.get(ratio_key(r)),
        ]
        for r in ratios
    ]
    return [
        save(fig, out / "fig5_crossover.png"),
        write_csv(out / "fig5_crossover.csv", ["io_ratio", "nd", "pd", "af", "pdaf", "pdaf_median"], rows),
    ]


def fig_modes(out: Path, name: str, sweep: Mapping, panel_ratios: Sequence[float]) -> list[Path]:
    """Grouped bars per model of PD, AF, PDAF x ND at each panel ratio (shared y, parity line)."""
    ratios = [r for r in panel_ratios if any(math.isclose(r, x) for x in sweep["io_ratios"])]
    models = list(sweep["models"])
    pyplot = plt()
    fig, axes = pyplot.subplots(
        1, len(ratios), figsize=(4.6 * len(ratios) + 0.6, 4.4), sharey=True, squeeze=False
    )
    rows = []
    width = 0.8 / len(SPLITS)
    for ax, ratio in zip(axes[0], ratios, strict=True):
        for i, mode in enumerate(SPLITS):
            ys = [_x_nd(sweep, m, ratio, mode) for m in models]
            color, label = MODE_STYLE[mode]
            xs = [j + (i - 1) * width for j in range(len(models))]
            ax.bar(xs, [y if y is not None else 0.0 for y in ys], width, color=color, label=label)
            for x, y in zip(xs, ys, strict=True):
                if y is None:  # no allocation of this mode fits the budget
                    ax.text(x, 0.02, "n/f", ha="center", va="bottom", fontsize=6, rotation=90, color=color)
        for m in models:
            rows.append([m, ratio, *(_x_nd(sweep, m, ratio, mode) for mode in SPLITS)])
        ax.axhline(1.0, color="black", ls="--", lw=1)
        ax.set_xticks(
            range(len(models)), [SHORT.get(m, m) for m in models], rotation=40, ha="right", fontsize=8
        )
        ax.set_title(f"I/O = {ratio:g}")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("throughput x ND")
    axes[0][0].legend(fontsize=8, loc="upper left")
    space = "custom NPUs, power budget" if sweep["catalog"] == "npu" else "GPUs, USD/hour budget"
    fig.suptitle(f"Disaggregated modes against ND ({space}; n/f = no allocation fits)")
    return [
        save(fig, out / f"{name}.png"),
        write_csv(out / f"{name}.csv", ["model", "io_ratio", "pd", "af", "pdaf"], rows),
    ]


TABLE5_COLUMNS = [
    "model",
    "stage",
    "device",
    "compute_tflops",
    "memory",
    "capacity_gb",
    "bandwidth_gbs",
    "num_devices",
    "tp",
    "pp",
    "dp",
    "ep",
    "precision_bits",
]


def table5_allocations(out: Path, sweep: Mapping, io_ratio: float = 100.0) -> list[Path]:
    """PDAF pools at ``io_ratio`` per model and stage, as Markdown and CSV (one per catalogue)."""
    by_model = sweep["allocations"].get(ratio_key(io_ratio), {})
    rows = []
    for model, modes in by_model.items():
        if not modes.get("pdaf"):
            rows.append([model, "-", "no PDAF allocation fits the budget", *[""] * 10])
        for pool in modes.get("pdaf", []):
            d = pool["device"]
            rows.append(
                [
                    model,
                    "+".join(pool["stages"]),
                    d["name"],
                    d["compute_tflops"],
                    d["memory"],
                    d["capacity_gb"],
                    d["bandwidth_gbs"],
                    pool["num_devices"],
                    pool["tp"],
                    pool["pp"],
                    pool["dp"],
                    pool["ep"],
                    pool["precision_bits"],
                ]
            )
    stem = f"table5_allocations_{sweep['catalog']}"
    lines = [
        f"PDAF allocations at I/O = {io_ratio:g}, {sweep['catalog']} catalogue",
        "",
        "| " + " | ".join(TABLE5_COLUMNS) + " |",
        "|" + "---|" * len(TABLE5_COLUMNS),
    ]
    lines += ["| " + " | ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in r) + " |" for r in rows]
    md = out / f"{stem}.md"
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [md, write_csv(out / f"{stem}.csv", TABLE5_COLUMNS, rows)]


def fig_ablation(out: Path, ablations: Mapping[str, Mapping]) -> list[Path]:
    """One column per factor: PDAF x ND against the value (top), DA intensity and KV share
    (bottom, KV share on the right axis)."""
    factors = list(ablations)
    pyplot = plt()
    fig, axes = pyplot.subplots(
        2, len(factors), figsize=(3.6 * len(factors) + 0.8, 6.4), squeeze=False, sharex="col"
    )
    rows = []
    colors = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, factor in enumerate(factors):
        abl = ablations[factor]
        top, bottom = axes[0][j], axes[1][j]
        twin = bottom.twinx()
        for i, model in enumerate(abl["models"]):
            pts = sorted((r for r in abl["rows"] if r["model"] == model), key=lambda r: r["value"])
            xs = [r["value"] for r in pts]
            color = colors[i % len(colors)]
            top.plot(
                xs,
                [r["x_nd"].get("pdaf") for r in pts],
                marker="o",
                color=color,
                label=SHORT.get(model, model),
            )
            bottom.plot(xs, [r["da_arithmetic_intensity"] for r in pts], marker="o", color=color)
            twin.plot(xs, [r["da_kv_share"] for r in pts], marker="x", ls="--", color=color)
            rows += [
                [
                    factor,
                    model,
                    r["value"],
                    *(r["x_nd"].get(m) for m in SPLITS),
                    r["da_arithmetic_intensity"],
                    r["da_kv_share"],
                    r["df_arithmetic_intensity"],
                ]
                for r in pts
            ]
        top.axhline(1.0, color="black", ls="--", lw=1)
        top.set_title(factor)
        ticks = sorted(float(v) for v in abl["values"])
        top.grid(alpha=0.3)
        bottom.set_xscale("log", base=2)
        bottom.set_xticks(ticks, [f"{v:g}" for v in ticks])
        bottom.minorticks_off()
        bottom.set_xlabel(f"{factor} value")
        bottom.set_yscale("log")
        bottom.grid(alpha=0.3)
        twin.set_ylim(0, 1.05)
        if j == len(factors) - 1:
            twin.set_ylabel("DA KV share of bytes (dashed)")
    axes[0][0].set_ylabel("PDAF throughput x ND")
    axes[1][0].set_ylabel("DA arithmetic intensity, FLOP/B")
    axes[0][0].legend(fontsize=8)
    first = ablations[factors[0]] if factors else {"io_ratio": 0}
    fig.suptitle(f"Ablations at I/O = {first['io_ratio']:g}, same search and budget")
    fig.tight_layout()
    header = [
        "factor",
        "model",
        "value",
        "pd_x_nd",
        "af_x_nd",
        "pdaf_x_nd",
        "da_arithmetic_intensity",
        "da_kv_share",
        "df_arithmetic_intensity",
    ]
    return [save(fig, out / "fig_ablation.png"), write_csv(out / "fig_ablation.csv", header, rows)]


def fig_workloads(out: Path, results: Mapping[str, Mapping[str, Mapping]]) -> list[Path]:
    """PD x ND per model for the agentic and chatbot workloads (same budget and rate)."""
    models = list(results)
    kinds = sorted({k for per in results.values() for k in per})
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(1.3 * len(models) + 3, 4.2))
    width = 0.8 / max(len(kinds), 1)
    rows = []
    for i, kind in enumerate(kinds):
        ys = [results[m].get(kind, {}).get("modes", {}).get("pd", {}).get("x_nd") for m in models]
        ax.bar(
            [j + (i - (len(kinds) - 1) / 2) * width for j in range(len(models))],
            [y or 0.0 for y in ys],
            width,
            label=kind,
        )
        for m, y in zip(models, ys, strict=True):
            wl = results[m].get(kind, {}).get("workload", {})
            rows.append([m, kind, y, wl.get("input_len"), wl.get("output_len")])
    ax.axhline(1.0, color="black", ls="--", lw=1)
    ax.set_xticks(range(len(models)), [SHORT.get(m, m) for m in models], rotation=30, ha="right")
    ax.set_ylabel("PD throughput x ND")
    ax.set_title("PD vs ND: agentic turns against chatbot requests (NPU, same budget and rate)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    return [
        save(fig, out / "fig_workloads.png"),
        write_csv(
            out / "fig_workloads.csv",
            ["model", "workload", "pd_x_nd", "mean_input_len", "mean_output_len"],
            rows,
        ),
    ]

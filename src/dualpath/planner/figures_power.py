"""``fig_power_fit``: modelled against datasheet power for the catalogue GPUs (the paper's Fig. 3).

The three fit anchors (A100, H100, B200) and every GPU of the catalogue are plotted with the
fitted alpha; the CSV carries the same rows.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from dualpath.planner.catalog import gpu_catalog
from dualpath.planner.power import ANCHORS, memory_power_w, power_fit

COLUMNS = (
    "gpu",
    "role",
    "compute_tflops",
    "memory",
    "capacity_gb",
    "bandwidth_gbs",
    "datasheet_w",
    "compute_w",
    "memory_w",
    "modelled_w",
    "rel_error",
)


def power_fit_rows() -> list[dict[str, object]]:
    """One row per anchor ("fit") and per catalogue GPU ("catalogue")."""
    fit = power_fit()
    rows: list[dict[str, object]] = []
    points = [
        (a.name, "fit", a.compute_tflops, a.memory_family, a.capacity_gb, a.bandwidth_gbs, a.tdp_w)
        for a in ANCHORS
    ]
    points += [
        (d.name, "catalogue", d.compute_tflops, d.memory, d.capacity_gb, d.bandwidth_gbs, d.power_w)
        for d in gpu_catalog()
    ]
    for name, role, tflops, family, gb, gbs, tdp in points:
        compute = fit.compute_power_w(tflops)
        mem = memory_power_w(family, gb, gbs)
        rows.append(
            dict(
                zip(
                    COLUMNS,
                    (
                        name,
                        role,
                        tflops,
                        family,
                        gb,
                        gbs,
                        tdp,
                        compute,
                        mem,
                        compute + mem,
                        (compute + mem) / tdp - 1.0,
                    ),
                )
            )
        )
    return rows


def _scatter_gpus(ax: Any, rows: list[dict]) -> None:
    """Each fit anchor and catalogue GPU at (datasheet, modelled) W, labelled with its name."""
    seen = set()
    for r in rows:
        if r["role"] == "catalogue" and r["gpu"] in {a.name for a in ANCHORS}:
            continue  # drawn as an anchor
        anchor = r["role"] == "fit"
        label = "fit anchor" if anchor else "catalogue GPU"
        x, y = float(r["datasheet_w"]), float(r["modelled_w"])  # type: ignore[arg-type]
        ax.scatter(
            [x],
            [y],
            marker="o" if anchor else "s",
            color="C3" if anchor else "C0",
            zorder=3,
            label=None if label in seen else label,
        )
        seen.add(label)
        ax.annotate(
            str(r["gpu"]),
            (x, y),
            textcoords="offset points",
            xytext=(4, 4) if anchor else (5, -11),
            fontsize=8,
        )


def plot_power_fit(out_dir: Path) -> list[Path]:
    """Write ``fig_power_fit.png`` and ``fig_power_fit.csv`` into ``out_dir``; return both paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = power_fit_rows()
    csv_path = out_dir / "fig_power_fit.csv"
    with csv_path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    fit = power_fit()
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    top = max(max(float(r["datasheet_w"]), float(r["modelled_w"])) for r in rows) * 1.15  # type: ignore[arg-type]
    low = min(min(float(r["datasheet_w"]), float(r["modelled_w"])) for r in rows) / 1.3  # type: ignore[arg-type]
    ax.plot([low, top], [low, top], color="0.5", lw=1, ls="--", label="modelled = datasheet")
    ax.fill_between([low, top], [low * 0.9, top * 0.9], [low * 1.1, top * 1.1], color="0.9", label="±10%")
    _scatter_gpus(ax, rows)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, top)
    ax.set_ylim(low, top)
    ax.set_xlabel("datasheet TDP (W)")
    ax.set_ylabel("modelled P_compute + P_mem (W)")
    ax.set_title(
        f"Power model: alpha = {fit.alpha:.3f}, P_ref = {fit.p_ref_w:.0f} W, "
        f"max anchor error {fit.max_rel_error:.1%}",
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    png_path = out_dir / "fig_power_fit.png"
    fig.savefig(png_path, dpi=130)
    plt.close(fig)
    return [png_path, csv_path]

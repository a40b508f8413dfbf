"""``simulate fidelity --out DIR``: the points as CSV and a simulated-vs-published plot (PNG)."""

from __future__ import annotations

import csv
import json
import os

CSV_COLUMNS = ("point", "group", "setting", "unit", "published", "simulated", "rel_error", "scaled")


def write_files(result: dict, out: str) -> list[str]:
    """Write ``fidelity.csv``, ``fidelity.png`` and ``fidelity.json`` into ``out``; their paths."""
    os.makedirs(out, exist_ok=True)
    csv_path = os.path.join(out, "fidelity.csv")
    with open(csv_path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_COLUMNS)
        for p in result["points"]:
            writer.writerow(["" if p[c] is None else p[c] for c in CSV_COLUMNS])
    png_path = os.path.join(out, "fidelity.png")
    plot(result, png_path)
    json_path = os.path.join(out, "fidelity.json")
    with open(json_path, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2)
    return [csv_path, png_path, json_path]


def plot(result: dict, path: str) -> None:
    """Simulated against published, one marker per point (marker = group), log axes, y = x;
    the ablation's reductions (negative %) by their size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 6))
    # log axes: a reduction (negative %) is drawn by its size; a point whose sign differs is left out
    shown = [p for p in result["points"] if p["simulated"] and p["published"] * p["simulated"] > 0]
    markers = "osD^v<>Ph*"
    groups = list(dict.fromkeys(p["group"] for p in shown))
    for i, group in enumerate(groups):
        pts = [p for p in shown if p["group"] == group]
        ax.scatter(
            [abs(p["published"]) for p in pts],
            [abs(p["simulated"]) for p in pts],
            marker=markers[i % len(markers)],
            label=group,
            alpha=0.8,
        )
    values = [abs(v) for p in shown for v in (p["published"], p["simulated"])]
    if values:
        lo, hi = min(values) / 1.5, max(values) * 1.5
        ax.plot([lo, hi], [lo, hi], color="grey", linewidth=1, label="y = x")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    left_out = len(result["points"]) - len(shown)
    note = f" ({left_out} points zero/missing or of the other sign, not shown)" if left_out else ""
    ax.set_title(f"Simulated vs published (spec section 10), scale {result['scale']}{note}", fontsize=9)
    ax.set_xlabel("published (s, APS, x or |%|; each point in its own unit)")
    ax.set_ylabel("simulated")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

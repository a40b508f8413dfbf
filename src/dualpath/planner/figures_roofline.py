"""Roofline plots of the planner (docs/planner.md, "Figures": figs. 6 and 8 of the list).

- ``fig_roofline_gap``: DA and DF operating points of each model at I/O = 100 on the rooflines of
  the devices PDAF chose for them (one panel per catalogue): the gap the paper credits for PDAF.
- ``fig_roofline_vs_measured``: the planner's roofline (``cost.stages.stage_time_s``, ideal
  efficiency, as the search uses it) against measured H100 GEMM TFLOPS from the aiconfigurator
  perf-db, plus a table of the planner's collective times against the measured NCCL tables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dualpath.planner.figures_modes import SHORT, plt, save, write_csv

GEMM_TABLE = Path("hardware/aiconfigurator-perf-db/h100_sxm/gemm/trtllm/1.3.0rc20/gemm_perf.parquet")
NCCL_TABLE = Path("hardware/aiconfigurator-perf-db/h100_sxm/comm/nccl/2.29.2/nccl_perf.parquet")
NCCL_DTYPE_BYTES = {"half": 2, "int8": 1}  # message_size counts elements (docs/cost.md)
NCCL_SIZES = (2**20, 2**24, 2**28)  # elements: 2 MB, 32 MB, 512 MB of half


def _attained(ai: float, peak_tflops: float, bw_gbs: float) -> float:
    """Roofline FLOP/s reachable at intensity ``ai`` (FLOP/B) on one device."""
    return min(peak_tflops * 1e12, ai * bw_gbs * 1e9)


def _points(result: Mapping) -> list[tuple[str, str, float, float, float]]:
    """(stage, device name, intensity, peak TFLOPS, GB/s) of DA and DF in the PDAF allocation."""
    pools = result["modes"].get("pdaf", {}).get("pools", [])
    prof = result["stage_profile"]
    out = []
    for pool in pools:
        for stage in pool["stages"]:
            if stage in ("da", "df"):
                dev = pool["device"]
                out.append(
                    (
                        stage,
                        dev["name"],
                        prof[stage]["arithmetic_intensity"],
                        float(dev["compute_tflops"]),
                        float(dev["bandwidth_gbs"]),
                    )
                )
    return out


def _gap_model(
    ax: Any,
    catalog: str,
    model: str,
    res: Mapping,
    color: str,
    devices: dict[str, tuple[float, float]],
    rows: list[list[Any]],
) -> None:
    """One model's DA and DF points (joined), its devices and CSV rows (both updated in place)."""
    pts = _points(res)
    xy = []
    for stage, dev, ai, peak, bw in pts:
        devices[dev] = (peak, bw)
        y = _attained(ai, peak, bw)
        xy.append((ai, y))
        ax.scatter(
            [ai],
            [y / 1e12],
            marker="o" if stage == "da" else "s",
            color=color,
            s=40,
            zorder=3,
            edgecolors="black" if stage == "df" else "none",
        )
        rows.append(
            [
                catalog,
                model,
                stage,
                dev,
                ai,
                peak,
                bw,
                y / 1e12,
                "memory" if ai * bw * 1e9 < peak * 1e12 else "compute",
            ]
        )
    if len(xy) == 2:
        ax.plot(
            [p[0] for p in xy],
            [p[1] / 1e12 for p in xy],
            color=color,
            lw=0.8,
            label=SHORT.get(model, model),
        )


def _gap_rooflines(ax: Any, devices: Mapping[str, tuple[float, float]]) -> None:
    """Each device's roofline with its ridge point, or a note when no allocation fits."""
    xs = [10 ** (k / 10) for k in range(-10, 51)]
    for dev, (peak, bw) in devices.items():
        ax.plot(xs, [_attained(x, peak, bw) / 1e12 for x in xs], color="grey", lw=0.7, alpha=0.6)
        knee = peak * 1e12 / (bw * 1e9)  # ridge point, FLOP/B
        ax.annotate(
            f"{dev} (ridge {knee:.3g} FLOP/B)",
            (knee, peak),
            fontsize=6,
            color="grey",
            ha="left",
            va="bottom",
            rotation=0,
        )
    if not devices:
        ax.text(
            0.5,
            0.5,
            "no PDAF allocation fits the budget",
            transform=ax.transAxes,
            ha="center",
            va="center",
            color="grey",
        )


def _gap_axes(ax: Any, catalog: str) -> None:
    """Log axes, labels, title and legend of one catalogue's panel."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity, FLOP/byte")
    ax.set_ylabel("attainable TFLOPS (roofline)")
    name = "custom NPUs" if catalog == "npu" else "GPUs (H100 and peers)"
    ax.set_title(f"DA (circles) and DF (squares) at I/O = 100: {name}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="lower right")


def fig_roofline_gap(out: Path, panels: Mapping[str, Mapping[str, Mapping]]) -> list[Path]:
    """``panels``: catalogue -> model -> plan_disagg result at I/O = 100."""
    pyplot = plt()
    fig, axes = pyplot.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.8), squeeze=False)
    colors = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    rows: list[list[Any]] = []
    for ax, (catalog, by_model) in zip(axes[0], panels.items(), strict=True):
        devices: dict[str, tuple[float, float]] = {}
        for i, (model, res) in enumerate(by_model.items()):
            _gap_model(ax, catalog, model, res, colors[i % len(colors)], devices, rows)
        _gap_rooflines(ax, devices)
        _gap_axes(ax, catalog)
    fig.tight_layout()
    header = [
        "catalog",
        "model",
        "stage",
        "device",
        "arithmetic_intensity",
        "peak_tflops",
        "bandwidth_gbs",
        "attained_tflops",
        "bound",
    ]
    return [save(fig, out / "fig_roofline_gap.png"), write_csv(out / "fig_roofline_gap.csv", header, rows)]


def gemm_points(data: Path) -> list[tuple[int, int, int, float, float]]:
    """(m, n, k, measured TFLOPS, roofline TFLOPS) of every BF16 GEMM row of the H100 table."""
    import numpy as np

    from dualpath.cost.efficiency import IDEAL_EFFICIENCY
    from dualpath.cost.stages import StageWork, stage_time_s
    from dualpath.cost.tables import read_table, select
    from dualpath.planner.catalog import catalog

    h100 = next(d.device for d in catalog("gpu") if d.device.name == "h100")
    rows = select(read_table(data / GEMM_TABLE), gemm_dtype="bfloat16")
    shapes: dict[tuple[int, int, int], list[float]] = {}
    if rows is not None:
        for m, n, k, lat in zip(rows["m"], rows["n"], rows["k"], rows["latency"]):
            shapes.setdefault((int(m), int(n), int(k)), []).append(float(lat))
    frame = [(m, n, k, float(np.median(lats))) for (m, n, k), lats in sorted(shapes.items())]
    out = []
    for m, n, k, lat_ms in frame:
        flops = 2.0 * m * n * k
        work = StageWork(
            flops=flops,
            weight_bytes=2.0 * n * k,
            kv_read_bytes=0.0,
            kv_write_bytes=0.0,
            act_bytes=2.0 * (m * k + m * n),
            num_layers=1,
        )
        predicted_s = stage_time_s(work, h100, efficiency=IDEAL_EFFICIENCY, bits=16)
        out.append((int(m), int(n), int(k), flops / (lat_ms * 1e-3) / 1e12, flops / predicted_s / 1e12))
    return out


def collective_rows(data: Path) -> list[list[Any]]:
    """Planner all-reduce / all-to-all times (D2D link model) against the measured NCCL table."""
    import numpy as np

    from dualpath.cost.tables import read_table, select
    from dualpath.planner import links
    from dualpath.spec.hardware import get_gpu

    h100_nvlink_gbs = get_gpu("h100").nvlink_gbs  # 450 GB/s per direction (NVLink 4)
    frame = read_table(data / NCCL_TABLE)
    rows = []
    for op, kind in (("all_reduce", "allreduce"), ("alltoall", "alltoall")):
        for n in (2, 4, 8):
            for size in NCCL_SIZES:
                hit = select(frame, op_name=op, nccl_dtype="half", num_gpus=n, message_size=size)
                if hit is None:
                    continue
                nbytes = size * NCCL_DTYPE_BYTES["half"]
                measured_s = float(np.median(hit["latency"])) * 1e-3
                sim_s = links.collective_s(kind, nbytes, n)
                nvl_s = links.collective_s(kind, nbytes, n, d2d_gbs=h100_nvlink_gbs)
                rows.append(
                    [
                        op,
                        n,
                        nbytes,
                        measured_s * 1e6,
                        sim_s * 1e6,
                        sim_s / measured_s,
                        nvl_s * 1e6,
                        nvl_s / measured_s,
                    ]
                )
    return rows


def fig_roofline_vs_measured(out: Path, data: Path) -> list[Path]:
    pts = gemm_points(data)
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(6, 5))
    sc = ax.scatter(
        [p[4] for p in pts],
        [p[3] for p in pts],
        c=[math.log2(p[0]) for p in pts],
        s=4,
        alpha=0.5,
        cmap="viridis",
    )
    lim = (min(min(p[3], p[4]) for p in pts) * 0.8, 1200)
    ax.plot(lim, lim, color="black", ls="--", lw=1, label="measured = roofline")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(*lim)
    ax.set_ylim(*lim)
    ax.set_xlabel("roofline TFLOPS (planner, ideal efficiency, 989 TF / 3.35 TB/s)")
    ax.set_ylabel("measured TFLOPS (TensorRT-LLM GEMM, H100 SXM)")
    ratios = sorted(p[3] / p[4] for p in pts)
    median = ratios[len(ratios) // 2]
    ax.set_title(
        f"BF16 GEMMs on H100: measured / roofline median {median:.2f} ({len(pts)} shapes)", fontsize=10
    )
    fig.colorbar(sc, ax=ax, label="log2 m (tokens)")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3, which="both")
    files = [
        save(fig, out / "fig_roofline_vs_measured.png"),
        write_csv(
            out / "fig_roofline_vs_measured.csv", ["m", "n", "k", "measured_tflops", "roofline_tflops"], pts
        ),
    ]
    coll = collective_rows(data)
    header = [
        "op",
        "num_gpus",
        "message_bytes",
        "measured_us",
        "simulated_us",
        "simulated_over_measured",
        "simulated_at_h100_nvlink_us",
        "nvlink_over_measured",
    ]
    md = out / "table_collectives.md"
    lines = [
        "Planner D2D collective model (`planner.links.collective_s`) against measured NCCL "
        "(H100 SXM, half). `simulated` uses the planner's D2D of 3,600 GB/s per device "
        "(the paper's value); `at_h100_nvlink` the same formula at H100's 450 GB/s.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += [
        "| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in r) + " |" for r in coll
    ]
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [*files, md, write_csv(out / "table_collectives.csv", header, coll)]

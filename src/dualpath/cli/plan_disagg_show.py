"""Human output of ``dualpath plan disagg``: rich tables (units in the headers) and progress.

Progress goes to stderr (cli.progress), so that stdout keeps exactly the table or the one JSON
object.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dualpath.cli._common import print_table as _print_table

_G = 1e9


def print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    """The shared table printer, with missing values shown as "-"."""
    _print_table(title, columns, [["-" if v is None else v for v in row] for row in rows])


@contextmanager
def progress_lines(label: str, total: int | None) -> Iterator[Callable[[str], None]]:
    """Yield ``step(desc)``, called once per finished item (``total`` items, None if unknown):
    the shared :class:`dualpath.cli.progress.Progress` (a bar on a terminal, plain lines in a
    log, every few seconds even while one item runs long)."""
    from contextlib import ExitStack

    from dualpath.cli.progress import Progress

    # started at the first step, so an input error raised before any work prints only its
    # one `error:` line
    with ExitStack() as stack:
        bars: list[Progress] = []

        def step(desc: str) -> None:
            if not bars:
                bars.append(stack.enter_context(Progress(label, total=total)))
            bars[0].advance(description=f"{label}: {desc}")

        yield step


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _gb(value: float | None) -> float | None:
    return None if value is None else value / _G


def _pool_text(pool: dict) -> str:
    dev = pool["device"]
    return (
        f"{pool['name']}: {pool['num_devices']}x {dev['name']} "
        f"(t{pool['tp']} p{pool['pp']} d{pool['dp']} e{pool['ep']}, {pool['precision_bits']}b)"
    )


def show_plan(res: dict) -> None:
    """A plan's tables: each mode's best allocation, the arrival regime, the search counts."""
    _show_modes(res)
    _show_regime(res)
    _show_search(res)


def _show_modes(res: dict) -> None:
    budget = res["budget"]
    unit = "W" if budget["kind"] == "power_w" else "USD/h"
    rows = []
    for mode, rec in res["modes"].items():
        if not rec.get("feasible", True):
            rows.append([mode, None, None, None, None, None, None, None, "no allocation fits the budget"])
            continue
        rows.append(
            [
                mode + (" *" if mode == res["best_mode"] else ""),
                rec["x_nd"],
                rec["tokens_per_s"],
                rec["output_tokens_per_s"],
                rec["makespan_s"],
                rec["sigma_joint"],
                rec["budget_used"],
                _gb(rec["n2n_bytes"]),
                "; ".join(_pool_text(p) for p in rec["pools"]),
            ]
        )
    wl = res["workload"]
    print_table(
        f"{res['model']} on {res['catalog']}, I/O={res['io_ratio']:g} "
        f"({wl['num_requests']} requests at {wl['rate_rps']:g}/s, mean input "
        f"{wl['input_len']:.0f}, output {wl['output_len']:.0f} tokens); budget {budget['value']:.4g} {unit} "
        f"(scale {_g(budget['scale'])}); * = best",
        [
            "mode",
            "x ND",
            "tokens/s",
            "output tok/s",
            "makespan s",
            "sigma_joint",
            f"budget used {unit}",
            "N2N GB",
            "pools (devices, t p d e, bits)",
        ],
        rows,
    )


def _show_regime(res: dict) -> None:
    budget = res["budget"]
    ctx = res["context"]
    print_table(
        "regime: can ND keep up? (sigma >= 1: yes; ceiling = ND makespan / arrival window, the most "
        "any split can gain while the run is arrival-bound)",
        [
            "ND sigma",
            "arrival window s",
            "ceiling x ND",
            "budget anchor",
            "window tokens",
            "longest context",
            "over window",
        ],
        [
            [
                res["nd_sigma"],
                res["arrival_window_s"],
                res["arrival_bound_ceiling"],
                budget.get("anchor") or "explicit",
                ctx["window_tokens"],
                ctx["max_context_len"],
                f"{ctx['share_over_window']:.0%}" if ctx["exceeds_window"] else "none",
            ]
        ],
    )


def _show_search(res: dict) -> None:
    s = res["search"]
    print_table(
        "search",
        [
            "top K",
            "candidates",
            "pruned (budget)",
            "pruned (residency)",
            "allocations ranked",
            "simulated",
            "wall s",
        ],
        [
            [
                s["top_k"],
                s["candidates"],
                s["pruned_budget"],
                s["pruned_residency"],
                s["allocations_ranked"],
                s["simulated"],
                res.get("wall_s"),
            ]
        ],
    )


def show_sweep(res: dict) -> None:
    modes = list(res["model_mean_x_nd"])
    by: dict[tuple[str, float], dict[str, Any]] = {}
    for row in res["rows"]:
        cell = by.setdefault((row["model"], row["io_ratio"]), {})
        cell[row["mode"]] = row["x_nd"]
        if row["is_best"]:
            cell["best"] = row["mode"]
    rows = [[m, f"{r:g}", *(c.get(mode) for mode in modes), c.get("best", "")] for (m, r), c in by.items()]
    ratios = list(next(iter(res["model_mean_x_nd"].values()), {}))
    rows += [["model mean", k, *(res["model_mean_x_nd"][mode].get(k) for mode in modes), ""] for k in ratios]
    print_table(
        f"sweep on {res['catalog']}: throughput x ND",
        ["model", "I/O", *(f"{m} x ND" for m in modes), "best"],
        rows,
    )
    count_rows = [
        [k, *(f"{c[m]['beats_nd']} / {c[m]['best']}" for m in modes)] for k, c in res["counts"].items()
    ]
    print_table("models where the mode beats ND / is best", ["I/O", *modes], count_rows)


def show_ablate(res: dict) -> None:
    rows = [
        [
            r["model"],
            r["value"],
            r["x_nd"].get("pd"),
            r["x_nd"].get("af"),
            r["x_nd"].get("pdaf"),
            r["best_mode"],
            r["da_arithmetic_intensity"],
            r["da_kv_share"],
            r["df_arithmetic_intensity"],
        ]
        for r in res["rows"]
    ]
    print_table(
        f"ablation {res['factor']} at I/O={res['io_ratio']:g} (fixed budget)",
        [
            "model",
            res["factor"],
            "PD x ND",
            "AF x ND",
            "PDAF x ND",
            "best",
            "DA FLOP/B",
            "DA KV share",
            "DF FLOP/B",
        ],
        rows,
    )


def show_profile(res: dict) -> None:
    rows = []
    for name, st in res["stages"].items():
        at = st.get("at", {})
        rows.append(
            [
                name,
                st["flops"] / 1e12,
                _gb(st["weight_bytes"]),
                _gb(st["kv_bytes"]),
                st["kv_share"],
                st["arithmetic_intensity"],
                st["bound"],
                at.get("batch"),
                at.get("context_len"),
            ]
        )
    print_table(
        f"stage profile {res['model']}, I/O={res['io_ratio']:g} ({res['catalog']} roofline)",
        ["stage", "TFLOP", "weights GB", "KV GB", "KV share", "FLOP/B", "bound", "batch", "context tokens"],
        rows,
    )


def show_catalog(res: dict) -> None:
    rows = [
        [
            d["name"],
            d["compute_tflops"],
            d["memory"],
            d["capacity_gb"],
            d["bandwidth_gbs"],
            d["power_w"],
            d.get("usd_per_hr"),
        ]
        for d in res["devices"]
    ]
    print_table(
        f"{res['catalog']} catalogue ({len(rows)} devices)",
        ["device", "TFLOPS", "memory", "GB", "GB/s", "power W", "USD/h"],
        rows,
    )
    fit = res["power_fit"]
    print_table(
        f"power fit: alpha={fit['alpha']:.3f}, P_ref={fit['p_ref_w']:.4g} W at "
        f"{fit['f_ref_tflops']:g} TFLOPS, max error {fit['max_rel_error']:.1%}",
        ["anchor", "modelled W", "datasheet W", "rel. error"],
        [[a["name"], a["modelled_w"], a["datasheet_w"], a["rel_error"]] for a in fit["anchors"]],
    )

"""``dualpath simulate figures``: regenerate the paper's experiments as PNG + CSV (+ index JSON).

Each figure is a small sweep over ``experiments.offline`` / ``online.run_online``; ``quick`` shrinks
agent counts and horizons so the whole set runs in minutes on one core. matplotlib (Agg backend)
is imported lazily. The rich progress bar goes to stderr.
"""

from __future__ import annotations

import csv
import json
import os

from dualpath.sim.harness.experiments import WorkloadSpec, make_cluster, offline

MODEL = "deepseek-v3.2"
QUICK_AGENTS = 64  # agents per run in --quick mode (tests shrink it)


def _agents(quick: bool) -> list[int]:
    return [QUICK_AGENTS // 2, QUICK_AGENTS] if quick else [512, 1024, 2048, 4096]


def _write_csv(path: str, header: list[str], rows: list[list]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)


def _plot(
    path: str, title: str, xlabel: str, ylabel: str, series: dict[str, tuple[list, list]], bars: bool = False
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    if bars:
        names = list(series)
        width = 0.8 / max(len(names), 1)
        for i, name in enumerate(names):
            xs, ys = series[name]
            ax.bar([j + i * width for j in range(len(xs))], ys, width, label=name)
        first = series[names[0]][0] if names else []
        labels = [str(x) for x in first]
        crowded = sum(len(t) for t in labels) > 40  # long category names: slant them
        ax.set_xticks(
            [j + width * (len(names) - 1) / 2 for j in range(len(first))],
            labels,
            rotation=30 if crowded else 0,
            ha="right" if crowded else "center",
        )
    else:
        for name, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="o", label=name)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fig_offline_grid(out: str, quick: bool) -> list[str]:
    systems = ["basic", "dualpath", "oracle"]
    rows, files = [], []
    for maxlen in [65536] if quick else [32768, 49152, 65536]:
        series: dict[str, tuple[list, list]] = {s: ([], []) for s in systems}
        for n in _agents(quick):
            res = offline(systems, make_cluster(MODEL, "2p4d"), WorkloadSpec(maxlen=maxlen, num_agents=n))
            for s in systems:
                rows.append([maxlen, n, s, res[s]["jct_s"]])
                series[s][0].append(n)
                series[s][1].append(res[s]["jct_s"])
        png = os.path.join(out, f"offline_jct_{maxlen // 1024}k.png")
        _plot(png, f"Offline JCT, DS 660B 2P4D, {maxlen // 1024}K", "agents", "JCT (s)", series)
        files.append(png)
    path = os.path.join(out, "offline_jct.csv")
    _write_csv(path, ["maxlen", "agents", "system", "jct_s"], rows)
    return [path, *files]


def fig_pd_ratio(out: str, quick: bool) -> list[str]:
    # DS 660B needs >= 4 decode nodes per EP group for KV room (weights: ~37 GB/GPU at EP32)
    pds = ["2p4d", "4p4d", "2p6d"] if quick else ["2p4d", "3p4d", "2p6d", "4p4d", "2p8d", "4p8d"]
    n = QUICK_AGENTS if quick else 2048
    rows: list[list] = []
    series: dict[str, tuple[list, list]] = {"basic": ([], []), "dualpath": ([], [])}
    for pd in pds:
        res = offline(list(series), make_cluster(MODEL, pd), WorkloadSpec(num_agents=n))
        for s in series:
            rows.append([pd, s, res[s]["jct_s"]])
            series[s][0].append(pd)
            series[s][1].append(res[s]["jct_s"])
    path = os.path.join(out, "pd_ratio.csv")
    _write_csv(path, ["pd", "system", "jct_s"], rows)
    png = os.path.join(out, "pd_ratio.png")
    _plot(png, f"JCT vs P/D ({n} agents, 64K)", "P/D", "JCT (s)", series, bars=True)
    return [path, png]


def fig_scaling(out: str, quick: bool) -> list[str]:
    n = QUICK_AGENTS if quick else 1024
    rows, files = [], []
    for knob in ("append", "gen"):
        series: dict[str, tuple[list, list]] = {"basic": ([], []), "dualpath": ([], [])}
        for scale in [0.5, 2.0] if quick else [0.5, 1.0, 2.0, 4.0]:
            wl = (
                WorkloadSpec(num_agents=n, append_scale=scale)
                if knob == "append"
                else WorkloadSpec(num_agents=n, gen_scale=scale)
            )
            res = offline(list(series), make_cluster(MODEL, "2p4d"), wl)
            for s in series:
                rows.append([knob, scale, s, res[s]["jct_s"]])
                series[s][0].append(scale)
                series[s][1].append(res[s]["jct_s"])
        png = os.path.join(out, f"scaling_{knob}.png")
        _plot(png, f"JCT vs {knob} scale ({n} agents)", f"{knob} scale", "JCT (s)", series)
        files.append(png)
    path = os.path.join(out, "scaling.csv")
    _write_csv(path, ["knob", "scale", "system", "jct_s"], rows)
    return [path, *files]


def fig_online(out: str, quick: bool) -> list[str]:
    from dualpath.sim.harness.experiments import make_trajectories
    from dualpath.sim.harness.online import run_online

    base = make_trajectories(WorkloadSpec(num_agents=500))
    rates = [0.1, 0.3] if quick else [0.1, 0.2, 0.3, 0.4, 0.45, 0.5]
    horizon = 300.0 if quick else 3600.0
    rows: list[list] = []
    ttft: dict[str, tuple[list, list]] = {}
    tpot: dict[str, tuple[list, list]] = {}
    for s in ("basic", "dualpath"):
        ttft[s], tpot[s] = ([], []), ([], [])
        for aps in rates:
            p = run_online(s, make_cluster(MODEL, "2p4d"), base, aps, horizon_s=horizon)
            rows.append(
                [
                    s,
                    aps,
                    p["ttft_mean_s"],
                    p["ttst_mean_s"],
                    p["tpot_mean_s"],
                    p["ttft_p90_s"],
                    p["meets_slo"],
                ]
            )
            ttft[s][0].append(aps)
            ttft[s][1].append(p["ttft_mean_s"] or 0.0)
            tpot[s][0].append(aps)
            tpot[s][1].append(p["tpot_mean_s"] or 0.0)
    path = os.path.join(out, "online.csv")
    _write_csv(
        path, ["system", "aps", "ttft_mean_s", "ttst_mean_s", "tpot_mean_s", "ttft_p90_s", "meets_slo"], rows
    )
    p1, p2 = os.path.join(out, "online_ttft.png"), os.path.join(out, "online_tpot.png")
    _plot(p1, "Online TTFT (DS 660B 2P4D)", "APS", "mean TTFT (s)", ttft)
    _plot(p2, "Online TPOT (DS 660B 2P4D)", "APS", "mean TPOT (s)", tpot)
    return [path, p1, p2]


ABLATION_SYSTEMS = (
    "basic",
    "layerwise",
    "dualpath-rr-random",
    "dualpath-rr",
    "dualpath",
    "dualpath-split",
    "oracle",
)
ABLATION_COLUMNS = (
    "agents",
    "system",
    "jct_s",
    "scheduling_s",
    "allocation_s",
    "reading_s",
    "prefill_s",
    "snic_max_over_avg",
    "attn_max_over_avg",
)


def _ablation_row(n: int, system: str, r: dict) -> list:
    """One ``ABLATION_COLUMNS`` row: a system's JCT, TTFT breakdown and balance at ``n`` agents."""
    bd = r["ttft_breakdown_s"]
    return [
        n,
        system,
        r["jct_s"],
        bd["scheduling"],
        bd["allocation"],
        bd["reading"],
        bd["prefill"],
        r["snic_max_over_avg"],
        r["attn_max_over_avg"],
    ]


def fig_ablation(out: str, quick: bool) -> list[str]:
    systems = list(ABLATION_SYSTEMS)
    rows, breakdown, balance = [], {}, {}
    for n in [QUICK_AGENTS] if quick else [1024, 2048]:
        res = offline(systems, make_cluster(MODEL, "2p4d"), WorkloadSpec(num_agents=n))
        for s in systems:
            r = res[s]
            rows.append(_ablation_row(n, s, r))
            bd = r["ttft_breakdown_s"]
            breakdown[s] = (list(bd), list(bd.values()))
            balance[s] = (["snic max/avg", "attn max/avg"], [r["snic_max_over_avg"], r["attn_max_over_avg"]])
    path = os.path.join(out, "ablation.csv")
    _write_csv(path, list(ABLATION_COLUMNS), rows)
    p1 = os.path.join(out, "ttft_breakdown.png")
    p2 = os.path.join(out, "balance.png")
    p3 = os.path.join(out, "ablation.png")
    _plot(p1, "TTFT breakdown (s)", "stage", "seconds", breakdown, bars=True)
    _plot(p2, "SNIC and attention balance", "metric", "max/avg", balance, bars=True)
    last = [r for r in rows if r[0] == rows[-1][0]]
    _plot(
        p3,
        "Ablation JCT",
        "system",
        "JCT (s)",
        {"jct": ([r[1] for r in last], [r[2] for r in last])},
        bars=True,
    )
    return [path, p1, p2, p3]


def fig_large_scale(out: str, quick: bool) -> list[str]:
    cases = (
        [("2p4d", QUICK_AGENTS), ("8p16d", 4 * QUICK_AGENTS)]
        if quick
        else [("2p4d", 2048), ("48p96d", 49152)]
    )
    rows = []
    for pd, n in cases:
        r = offline(["dualpath"], make_cluster(MODEL, pd), WorkloadSpec(num_agents=n))["dualpath"]
        rows.append([pd, n, r["jct_s"], r["wall_s"], r["requests_per_wall_s"]])
    path = os.path.join(out, "large_scale.csv")
    _write_csv(path, ["pd", "agents", "jct_s", "wall_s", "sim_req_per_wall_s"], rows)
    png = os.path.join(out, "large_scale.png")
    _plot(
        png,
        "Scale-out: JCT at constant agents per unit",
        "cluster",
        "JCT (s)",
        {"dualpath": ([f"{r[0]}/{r[1]}" for r in rows], [r[2] for r in rows])},
        bars=True,
    )
    return [path, png]


FIGURES = {
    "offline_grid": fig_offline_grid,
    "pd_ratio": fig_pd_ratio,
    "scaling": fig_scaling,
    "online": fig_online,
    "ablation": fig_ablation,
    "large_scale": fig_large_scale,
}


def make_figures(out: str, *, quick: bool = False, only: list[str] | None = None) -> dict:
    """Run every figure's sweep; returns ``{"files": [...], "figures": [...]}`` (also index.json)."""
    from rich.console import Console
    from rich.progress import Progress

    os.makedirs(out, exist_ok=True)
    names = only or list(FIGURES)
    files: list[str] = []
    with Progress(console=Console(stderr=True)) as bar:
        task = bar.add_task("figures", total=len(names))
        for name in names:
            bar.update(task, description=f"figure {name}")
            files += FIGURES[name](out, quick)
            bar.advance(task)
    index = {"figures": names, "files": files, "quick": quick}
    with open(os.path.join(out, "index.json"), "w", encoding="utf-8") as fh:
        json.dump(index, fh, indent=2)
    return index

"""``dualpath workload stats|generate``: Table 2 statistics and synthetic trajectory files."""

from __future__ import annotations

from typing import Any

import typer

workload_app = typer.Typer(
    help="Agent workloads: Table 2 statistics, synthetic trajectories, traces.", no_args_is_help=True
)

MAXLEN_HELP = "MaxLen bucket: 32k, 48k or 64k (calibrated to Table 2); other token counts interpolate."


STAT_UNITS = {
    "turns": "turns",
    "append_per_turn": "tokens/turn",
    "gen_per_turn": "tokens/turn",
    "final_len": "tokens",
    "context_len": "tokens",
    "hit_rate": "fraction",
    "hit_rate_tokens": "fraction",
    "num_trajectories": "trajectories",
    "max_final_len": "tokens",
}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _load(maxlen: str, num: int, seed: int, trace: str | None) -> tuple[list[Any], dict[str, Any]]:
    from dualpath.workload import generate_trajectories, load_trace, resolve_maxlen

    if trace is not None:
        trajs = load_trace(trace)
        return trajs, {"source": str(trace), "maxlen": None, "seed": None}
    max_len = resolve_maxlen(maxlen)
    return generate_trajectories(max_len, num, seed), {"source": "synthetic", "maxlen": max_len, "seed": seed}


def _replay(
    trajs: list[Any],
    agents: int | None,
    seed: int,
    append_scale: float,
    gen_scale: float,
    max_len: int | None,
) -> list[Any]:
    from dualpath.workload import ReplayConfig, expand_agents

    if agents is None and append_scale == 1.0 and gen_scale == 1.0:
        return trajs
    cfg = ReplayConfig(
        num_agents=agents or len(trajs),
        seed=seed,
        append_scale=append_scale,
        gen_scale=gen_scale,
        max_len=max_len,
    )
    return expand_agents(trajs, cfg)


@workload_app.command("stats")
def stats_cmd(
    maxlen: str = typer.Option("64k", help=MAXLEN_HELP),
    num: int = typer.Option(500, help="Number of synthetic trajectories."),
    seed: int = typer.Option(0, help="Generator seed."),
    trace: str = typer.Option(
        None,
        help="Use a trace instead: mooncake-conversation, "
        "mooncake-synthetic, azure-code, azure-conv, or a file path.",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Print the Table 2 columns of a generated set (with the paper's targets) or of a trace."""
    from dualpath.cli._common import print_json, print_table
    from dualpath.workload import STAT_COLUMNS, TABLE2, workload_stats

    trajs, meta = _load(maxlen, num, seed, trace)
    stats = workload_stats(trajs)
    target = TABLE2.get(meta["maxlen"]) if meta["maxlen"] is not None else None
    rel = {c: stats[c] / target[c] - 1.0 for c in STAT_COLUMNS} if target else None
    if json_out:
        print_json({**meta, **stats, "targets": target, "rel_error": rel})
        return
    columns = ["statistic", "unit", "value"] + (["paper (Table 2)", "error vs paper (%)"] if target else [])
    rows = []
    for col in (*STAT_COLUMNS, "hit_rate_tokens", "num_trajectories", "max_final_len"):
        row: list[Any] = [col, STAT_UNITS.get(col, ""), _fmt(stats[col])]
        if target:
            row += (
                [_fmt(target[col]), f"{rel[col]:+.1%}"]
                if col in target  # type: ignore[index]
                else ["", ""]
            )
        rows.append(row)
    where = meta["source"] if trace else f"synthetic {meta['maxlen']} tokens, seed {seed}"
    print_table(
        f"Workload statistics: {where}",
        columns,
        rows,
        legend=[
            "Per-trajectory means averaged over trajectories; hit_rate = 1 - "
            "append_per_turn / context_len (as Table 2 derives it), hit_rate_tokens = "
            "the token-weighted cached fraction of all prompts."
        ],
    )


@workload_app.command("generate")
def generate_cmd(
    out: str = typer.Option(..., help="Output trajectory JSONL file."),
    maxlen: str = typer.Option("64k", help=MAXLEN_HELP),
    num: int = typer.Option(500, help="Number of synthetic trajectories."),
    seed: int = typer.Option(0, help="Generator seed (also picks clones)."),
    trace: str = typer.Option(None, help="Convert a trace instead of generating."),
    agents: int = typer.Option(
        None,
        help="Expand to this many agents (clones with a "
        "synthetic first turn when more than the trajectories).",
    ),
    append_scale: float = typer.Option(1.0, help="Multiply every append length."),
    gen_scale: float = typer.Option(1.0, help="Multiply every generation length."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Write synthetic (or trace-derived) trajectories as JSONL, one trajectory per line."""
    from dualpath.cli._common import console, print_json
    from dualpath.workload import save_jsonl, workload_stats

    trajs, meta = _load(maxlen, num, seed, trace)
    trajs = _replay(trajs, agents, seed, append_scale, gen_scale, meta["maxlen"])
    save_jsonl(trajs, out)
    stats = workload_stats(trajs)
    summary = {
        **meta,
        "out": out,
        "num_trajectories": len(trajs),
        "total_turns": stats["total_turns"],
        "turns": stats["turns"],
        "final_len": stats["final_len"],
    }
    if json_out:
        print_json(summary)
    else:
        console.print(f"wrote {len(trajs)} trajectories ({stats['total_turns']} turns) to {out}")


def register(app: typer.Typer) -> None:
    """Add ``dualpath workload ...`` to the top-level app."""
    app.add_typer(workload_app, name="workload")

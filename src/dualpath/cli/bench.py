"""``dualpath bench``: replay agent trajectories against an OpenAI-compatible endpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer


def _run_with_progress(cfg: Any, show: bool) -> Any:
    import asyncio

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dualpath.bench import run_bench
    from dualpath.bench.runner import total_turns

    progress = Progress(TextColumn("replaying turns"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(stderr=True), disable=not show,
                        transient=True)
    task = progress.add_task("turns", total=None)
    with progress:
        return asyncio.run(run_bench(
            cfg, on_turn=lambda _res: progress.advance(task),
            on_start=lambda run: progress.update(task, total=total_turns(run))))


def _write_outputs(run: Any, summary: dict[str, Any], out: str) -> dict[str, str]:
    from dualpath.bench import plot_cdfs, request_rows

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bench.json").write_text(json.dumps(summary, indent=2))
    with open(folder / "requests.jsonl", "w") as f:
        for row in request_rows(run):
            f.write(json.dumps(row) + "\n")
    png = plot_cdfs(run, folder / "latency_cdf.png")
    return {"summary": str(folder / "bench.json"), "requests": str(folder / "requests.jsonl"),
            "plot": str(png)}


def _print_tables(summary: dict[str, Any]) -> None:
    from dualpath.cli._common import print_table

    rows = []
    for name, stats in (*summary["latency_s"].items(), ("jct_s", summary["jct_s"])):
        rows.append([name, stats["count"], *(stats[k] if stats[k] is not None else "-"
                                             for k in ("mean", "p50", "p90", "p99", "max"))])
    print_table(f"dualpath bench: {summary['num_agents']} agents ({summary['mode']}) on "
                f"{summary['model']} at {summary['url']}",
                ["metric (s)", "count", "mean", "p50", "p90", "p99", "max"], rows)
    slo, tput = summary["slo"], summary["throughput"]
    print_table("Summary", ["requests ok/failed", "agents finished", "SLO attainment",
                            "TTFT / TPOT attainment", "gen tok/s", "wall s"],
                [[f"{summary['num_ok']}/{summary['num_failed']}",
                  f"{summary['num_agents_finished']}/{summary['num_agents']}",
                  f"{slo['attainment']:.1%}",
                  f"{slo['ttft_attainment']:.1%} / {slo['tpot_attainment']:.1%}",
                  tput["generated_tokens_per_s"], summary["wall_s"]]])


def register(app: typer.Typer) -> None:
    """Add ``dualpath bench``."""

    @app.command("bench")
    def bench_cmd(
        url: str = typer.Option("http://127.0.0.1:8000", help="Base URL of the OpenAI-compatible "
                                "server (ours, vLLM, SGLang), without /v1."),
        agents: int = typer.Option(4, help="Number of agents (trajectories; clones beyond the set)."),
        maxlen: str = typer.Option("32k", help="MaxLen bucket of the trajectories (e.g. 8k, 32k, "
                                   "64k); scaled down to the endpoint's context."),
        aps: float = typer.Option(None, help="Online mode: agents per second (Poisson arrivals). "
                                  "Omitted: offline, all agents at once (JCT)."),
        trace: str = typer.Option("synthetic", help="synthetic, mooncake, or a trace name/path."),
        model: str = typer.Option(None, help="Model name (default: the first one of /v1/models)."),
        api_key: str = typer.Option(None, envvar="DUALPATH_API_KEY", help="Bearer API key."),
        max_context: int = typer.Option(None, help="Context limit in tokens (default: the "
                                        "endpoint's max_model_len)."),
        max_turns: int = typer.Option(None, help="Cap on turns per agent."),
        seed: int = typer.Option(0, help="Seed of trajectories, token ids and arrivals."),
        ttft_slo: float = typer.Option(4.0, help="TTFT SLO in seconds."),
        tpot_slo_ms: float = typer.Option(50.0, help="TPOT SLO in milliseconds."),
        duration: float = typer.Option(600.0, help="Stop the run after this many seconds."),
        out: str = typer.Option(None, help="Folder for bench.json, requests.jsonl, latency_cdf.png."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Replay agent trajectories against an endpoint; report TTFT/TTST/TPOT/JCT and SLOs."""
        from dualpath.bench import BenchConfig, summarize
        from dualpath.cli._common import print_json
        from dualpath.core.units import parse_tokens

        cfg = BenchConfig(url=url.rstrip("/"), num_agents=agents, maxlen=parse_tokens(maxlen),
                          aps=aps, trace=trace, model=model, api_key=api_key,
                          max_context_len=max_context, max_turns=max_turns, seed=seed,
                          ttft_slo_s=ttft_slo, tpot_slo_s=tpot_slo_ms / 1e3, duration_s=duration)
        run = _run_with_progress(cfg, show=not json_out)
        summary = summarize(run)
        if out is not None:
            summary["files"] = _write_outputs(run, summary, out)
        if json_out:
            print_json(summary)
            return
        _print_tables(summary)
        if out is not None:
            typer.echo(f"wrote {', '.join(summary['files'].values())}")

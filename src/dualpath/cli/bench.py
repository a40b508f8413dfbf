"""``dualpath bench``: agents or a trace against an OpenAI-compatible endpoint, in vLLM's conventions.

Flags that ``vllm bench serve`` also has mean the same thing there (``--base-url``, ``--model``,
``--dataset-name``, ``--dataset-path``, ``--num-prompts``, ``--input-len``, ``--output-len``,
``--request-rate``, ``--burstiness``, ``--max-concurrency``, ``--seed``, ``--percentile-metrics``,
``--metric-percentiles``, ``--save-result``, ``--save-detailed``, ``--result-dir``,
``--result-filename``, ``--label``). Exit code 1 when any request failed (``--allow-failures``: 0).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from dualpath.cli.bench_options import BenchOptions
from dualpath.cli.option_fields import command_from


def _run_with_progress(cfg: Any, show: bool) -> Any:
    """Run the bench with progress on stderr: a rich bar on a terminal, plain lines in a log
    (cli.progress); ``show=False`` (``--json``) keeps stderr quiet."""
    import asyncio

    from dualpath.bench import run_bench
    from dualpath.bench.runner import total_requests

    if not show:
        return asyncio.run(run_bench(cfg))
    from dualpath.cli.progress import Progress

    with Progress("bench requests", total=None) as bar:
        return asyncio.run(
            run_bench(
                cfg,
                on_turn=lambda _res: bar.advance(),
                on_start=lambda run: bar.update(total=total_requests(run)),
            )
        )


def result_path(result: dict[str, Any], result_dir: str | None, result_filename: str | None) -> Path:
    """vLLM's default name: ``{label}-{request_rate}qps[-concurrency{N}]-{model}-{date}.json``."""
    conc = f"-concurrency{result['max_concurrency']}" if result["max_concurrency"] is not None else ""
    name = result_filename or (
        f"{result['label']}-{result['request_rate']}qps{conc}-"
        f"{str(result['model_id']).split('/')[-1]}-{result['date']}.json"
    )
    return Path(result_dir or ".") / name


def _save(run: Any, result: dict[str, Any], path: Path) -> list[str]:
    from dualpath.bench import plot_cdfs
    from dualpath.cli._common import _jsonable

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(result)))
    png = plot_cdfs(run, path.with_name(path.stem + "_cdf.png"))
    return [str(path), str(png)]


def register(app: typer.Typer) -> None:
    """Add ``dualpath bench``."""
    app.command("bench")(command_from(BenchOptions, bench_cmd))


def bench_cmd(opts: BenchOptions) -> None:
    """Replay agents or a trace against an endpoint; vLLM's summary plus JCT/TTST/cache hits."""
    from dualpath.bench import detailed, format_summary, summarize
    from dualpath.cli._common import print_json

    cfg = opts.to_config()
    run = _run_with_progress(cfg, show=not opts.json_out)
    result = {**summarize(run), "label": opts.label}
    if opts.save_detailed:
        result.update(detailed(run))
    if opts.save_result:
        files = _save(run, result, result_path(result, opts.result_dir, opts.result_filename))
    if result["failed"]:  # said first: the numbers below are over the requests that finished
        _say_failures(result, opts)
    if opts.json_out:
        print_json(result)
    else:
        typer.echo(format_summary(result, cfg.metrics))
    if opts.save_result:
        typer.echo(f"wrote {', '.join(files)}", err=opts.json_out)
    if result["failed"] and not opts.allow_failures:
        raise typer.Exit(1)


def _say_failures(result: dict[str, Any], opts: BenchOptions) -> None:
    """How many requests failed, on stderr, before any number (which is over those that finished)."""
    where = "failure_reasons" if opts.json_out else "Failures below"
    typer.echo(
        f"{'error' if not opts.allow_failures else 'warning'}: {result['failed']} of "
        f"{result['num_prompts']} requests failed (reasons: {where}); every rate and "
        "latency below is over the requests that finished"
        + ("" if opts.allow_failures else "; --allow-failures exits 0 anyway"),
        err=True,
    )

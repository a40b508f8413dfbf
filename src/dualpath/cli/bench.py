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

from dualpath.bench.config import DATASETS, BenchConfig
from dualpath.cli._common import choices_help

_D = BenchConfig()  # every flag's default is BenchConfig's


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

    @app.command("bench")
    def bench_cmd(
        base_url: str = typer.Option(
            _D.url,
            "--base-url",
            "--url",
            help="Server base URL without /v1 (ours, vLLM, SGLang).",
        ),
        model: str = typer.Option(None, help="Model name (default: the first of /v1/models)."),
        dataset_name: str = typer.Option(
            _D.dataset_name,
            help=choices_help(
                "agents (multi-turn agents), mooncake (a Mooncake JSONL trace at its own timing) or random",
                DATASETS,
            ),
        ),
        dataset_path: str = typer.Option(None, help="The Mooncake JSONL trace (mooncake only)."),
        agents: int = typer.Option(
            _D.num_agents,
            help="agents: number of agents (each sends one request "
            "per turn; clones beyond the trajectory set).",
        ),
        maxlen: str = typer.Option(
            f"{_D.maxlen // 1024}k" if _D.maxlen % 1024 == 0 else str(_D.maxlen),
            help="agents: longest context of a trajectory (any "
            "size, e.g. 512, 8k, 32k); capped by the endpoint's context.",
        ),
        trace: str = typer.Option(
            _D.trace, help="agents: synthetic, or a trace name/path whose sessions become agents."
        ),
        max_turns: int = typer.Option(None, help="agents: cap on turns per agent."),
        num_prompts: int = typer.Option(
            None, help="mooncake: first N records (default all); random: N prompts (default 8)."
        ),
        input_len: int = typer.Option(_D.input_len, help="random: prompt tokens per request."),
        output_len: int = typer.Option(
            None, help="Output tokens of every request/turn (default: the dataset's; random: 16)."
        ),
        block_len: int = typer.Option(
            _D.block_len,
            help="mooncake: tokens sent per 512-token hash block "
            "(smaller sizes the trace down, sharing kept).",
        ),
        time_scale: float = typer.Option(
            _D.time_scale, help="mooncake: replay speed-up (2 = twice as fast)."
        ),
        request_rate: float = typer.Option(
            _D.request_rate,
            "--request-rate",
            "--aps",
            help="Arrivals per second (agents: agent arrivals; "
            "inf: all at once, mooncake: the trace's timing).",
        ),
        burstiness: float = typer.Option(_D.burstiness, help="Gamma shape of arrival gaps (1 = Poisson)."),
        max_concurrency: int = typer.Option(None, help="Most requests in flight (default: no cap)."),
        seed: int = typer.Option(_D.seed, help="Seed of trajectories, token ids and arrivals."),
        scale: float = typer.Option(
            None, help="agents (synthetic): scale of every append and generation (default: fit --maxlen)."
        ),
        token_seed: int = typer.Option(
            None, help="Seed of the token ids alone (default: --seed): same lengths, fresh tokens."
        ),
        max_context: int = typer.Option(
            None, help="Context limit in tokens (default: the endpoint's max_model_len)."
        ),
        request_timeout: float = typer.Option(
            _D.request_timeout_s, help="Seconds one request may take, send to last token, before it fails."
        ),
        duration: float = typer.Option(_D.duration_s, help="Stop the run after this many seconds."),
        ttft_slo: float = typer.Option(_D.ttft_slo_s, help="TTFT SLO in seconds (goodput, attainment)."),
        tpot_slo_ms: float = typer.Option(_D.tpot_slo_s * 1e3, help="TPOT SLO in milliseconds."),
        percentile_metrics: str = typer.Option(
            _D.percentile_metrics, help="Metrics to report (vLLM names + ttst, jct)."
        ),
        metric_percentiles: str = typer.Option(
            _D.metric_percentiles, help="Percentiles to report, e.g. 50,90,99."
        ),
        api_key: str = typer.Option(None, envvar="DUALPATH_API_KEY", help="Bearer API key."),
        save_result: bool = typer.Option(
            False, "--save-result", help="Write the result JSON (and a CDF plot beside it)."
        ),
        save_detailed: bool = typer.Option(
            False, "--save-detailed", help="Add per-request lists (input_lens, ttfts, itls, errors, ...)."
        ),
        result_dir: str = typer.Option(None, help="Folder of the result JSON (default: .)."),
        result_filename: str = typer.Option(
            None, help="Name of the result JSON (default: {label}-{rate}qps-{model}-{date}.json)."
        ),
        label: str = typer.Option("dualpath", help="Label in the result and its file name."),
        allow_failures: bool = typer.Option(
            False, "--allow-failures", help="Exit 0 even when requests failed."
        ),
        json_out: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
    ) -> None:
        """Replay agents or a trace against an endpoint; vLLM's summary plus JCT/TTST/cache hits."""
        from dualpath.bench import BenchConfig, detailed, format_summary, summarize
        from dualpath.cli._common import print_json
        from dualpath.core.errors import ConfigError
        from dualpath.core.units import parse_tokens

        try:
            maxlen_tokens = parse_tokens(maxlen)
        except ConfigError as exc:
            raise ConfigError("maxlen", maxlen, exc.reason) from None
        cfg = BenchConfig(
            url=base_url.rstrip("/"),
            dataset_name=dataset_name,
            dataset_path=dataset_path,
            num_agents=agents,
            maxlen=maxlen_tokens,
            trace=trace,
            num_prompts=num_prompts,
            input_len=input_len,
            output_len=output_len,
            block_len=block_len,
            time_scale=time_scale,
            request_rate=request_rate,
            burstiness=burstiness,
            max_concurrency=max_concurrency,
            model=model,
            api_key=api_key,
            max_context_len=max_context,
            max_turns=max_turns,
            seed=seed,
            length_scale=scale,
            token_seed=token_seed,
            ttft_slo_s=ttft_slo,
            tpot_slo_s=tpot_slo_ms / 1e3,
            duration_s=duration,
            request_timeout_s=request_timeout,
            percentile_metrics=percentile_metrics,
            metric_percentiles=metric_percentiles,
        )
        run = _run_with_progress(cfg, show=not json_out)
        result = {**summarize(run), "label": label}
        if save_detailed:
            result.update(detailed(run))
        if save_result:
            files = _save(run, result, result_path(result, result_dir, result_filename))
        if result["failed"]:  # said first: the numbers below are over the requests that finished
            where = "failure_reasons" if json_out else "Failures below"
            typer.echo(
                f"{'error' if not allow_failures else 'warning'}: {result['failed']} of "
                f"{result['num_prompts']} requests failed (reasons: {where}); every rate and "
                "latency below is over the requests that finished"
                + ("" if allow_failures else "; --allow-failures exits 0 anyway"),
                err=True,
            )
        if json_out:
            print_json(result)
        else:
            typer.echo(format_summary(result, cfg.metrics))
        if save_result:
            typer.echo(f"wrote {', '.join(files)}", err=json_out)
        if result["failed"] and not allow_failures:
            raise typer.Exit(1)

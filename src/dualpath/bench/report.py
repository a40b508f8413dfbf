"""The result of a run in ``vllm bench serve``'s JSON keys, plus the agent metrics; CDF plot.

Same definitions as vLLM: ``completed``/``failed`` requests; throughputs over ``duration`` (the
run's wall time); TTFT from sending to the first token; TPOT = (E2EL - TTFT) / (output tokens - 1)
for answers longer than one token; ITL = gaps between streamed chunks; E2EL = sending to the end
of the stream; for each selected metric ``mean_/median_/std_<m>_ms`` and ``p<q>_<m>_ms`` for each
selected percentile (numpy's linear percentile). Where vLLM writes 0 for a metric with no samples
this writes null. Added: TTST (time to second token), JCT per agent that finished every turn,
``agent_throughput`` (agents finished per second), ``cache_hit_rate`` (server counters; null when
not reported), SLO attainment (requests with TTFT <= SLO and TPOT <= SLO over all requests,
failures count as misses; ``request_goodput`` is the same per second) and ``failure_reasons``.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from dualpath.bench.client import TurnResult
from dualpath.bench.runner import BenchRun


def metric_stats(name: str, values_s: list[float], percentiles: tuple[float, ...]) -> dict[str, Any]:
    """``mean_<name>_ms``, ``median_``, ``std_``, ``p<q>_`` in ms (None when no values)."""
    arr = np.asarray(values_s, dtype=float) * 1e3
    has = arr.size > 0
    out: dict[str, Any] = {
        f"mean_{name}_ms": float(arr.mean()) if has else None,
        f"median_{name}_ms": float(np.median(arr)) if has else None,
        f"std_{name}_ms": float(arr.std()) if has else None,
    }
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(arr, p)) if has else None
    return out


def metric_values(run: BenchRun, name: str) -> list[float]:
    """Samples in seconds of one metric over successful requests (jct: over finished agents)."""
    ok = [r for r in run.results if r.ok]
    if name == "jct":
        return [v for v in run.jct_s.values() if v is not None]
    if name == "itl":
        return [g for r in ok for g in r.itls_s]
    attr = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2e_s", "ttst": "ttst_s"}[name]
    return [v for r in ok if (v := getattr(r, attr)) is not None]


def _meets(res: TurnResult, ttft_slo_s: float, tpot_slo_s: float) -> bool:
    tpot = res.tpot_s
    return (
        res.ok
        and res.ttft_s is not None
        and res.ttft_s <= ttft_slo_s
        and (tpot is None or tpot <= tpot_slo_s)
    )


def _peaks(ok: list[TurnResult]) -> tuple[float, int]:
    """(most output tokens in one wall-clock second, most requests in flight at once)."""
    if not ok:
        return 0.0, 0
    first = min(r.sent_s or 0.0 for r in ok)
    seconds = Counter(int((r.sent_s or 0.0) + t - first) for r in ok for t in r.token_times_s)
    events = sorted(
        [((r.sent_s or 0.0), 1) for r in ok] + [((r.sent_s or 0.0) + (r.e2e_s or 0.0), -1) for r in ok]
    )
    level = peak = 0
    for _, delta in events:  # ends sort before starts at the same instant (half-open intervals)
        level += delta
        peak = max(peak, level)
    return float(max(seconds.values())), peak


def failure_reasons(run: BenchRun) -> dict[str, int]:
    """Failure message -> number of requests, most frequent first."""
    counts = Counter(r.error or "no tokens" for r in run.results if not r.ok)
    return dict(counts.most_common())


def summarize(run: BenchRun) -> dict[str, Any]:
    """One JSON-ready object: vLLM's result keys, then dualpath's."""
    cfg = run.config
    good = sum(_meets(r, cfg.ttft_slo_s, cfg.tpot_slo_s) for r in run.results)
    result = _vllm_keys(run, good)
    for name in cfg.metrics:
        result.update(metric_stats(name, metric_values(run, name), cfg.percentiles))
    result.update(_dualpath_keys(run, good))
    return result


def _vllm_keys(run: BenchRun, good: int) -> dict[str, Any]:
    """vLLM's ``benchmark_serving`` result keys (``good``: requests within both SLOs)."""
    cfg = run.config
    ok = [r for r in run.results if r.ok]
    n = len(run.results)
    dur = max(run.wall_s, 1e-9)
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.num_generated for r in ok)
    peak_tok_s, peak_conc = _peaks(ok)
    return {
        "date": run.date,
        "endpoint_type": "openai",
        "backend": "openai",
        "label": "dualpath",
        "model_id": run.endpoint.model,
        "tokenizer_id": None,
        "num_prompts": n,
        "request_rate": "inf" if math.isinf(cfg.request_rate) else cfg.request_rate,
        "burstiness": cfg.burstiness,
        "max_concurrency": cfg.max_concurrency,
        "duration": run.wall_s,
        "completed": len(ok),
        "failed": n - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur,
        "request_goodput": good / dur,
        "output_throughput": total_out / dur,
        "total_token_throughput": (total_in + total_out) / dur,
        "max_output_tokens_per_s": peak_tok_s,
        "max_concurrent_requests": peak_conc,
    }


def _dualpath_keys(run: BenchRun, good: int) -> dict[str, Any]:
    """dualpath's keys: the run's setup, agents, SLO attainment, the server's cache, failures."""
    cfg = run.config
    n = len(run.results)
    dur = max(run.wall_s, 1e-9)
    agents_done = sum(v is not None for v in run.jct_s.values())
    cache = run.cache
    return {
        "base_url": cfg.url,
        "dataset_name": cfg.dataset_name,
        "mode": cfg.mode,
        "num_agents": len(run.agents) if run.agents else None,
        "agents_completed": agents_done if run.agents else None,
        "agent_throughput": agents_done / dur if run.agents else None,
        "max_context_len": run.endpoint.max_context_len,
        "exact_token_ids": run.exact_token_ids,
        "truncated_requests": sum(s.truncated for s in run.requests),
        "ttft_slo_ms": cfg.ttft_slo_s * 1e3,
        "tpot_slo_ms": cfg.tpot_slo_s * 1e3,
        "slo_attainment": good / max(n, 1),
        "cache_hit_rate": cache.hit_rate if cache is not None else None,
        "cache_hit_tokens": cache.hit_tokens if cache is not None else None,
        "cache_query_tokens": cache.query_tokens if cache is not None else None,
        "cache_counters": cache.source if cache is not None else None,
        "num_429_retries": sum(r.num_429 for r in run.results),
        "request_timeout_s": cfg.request_timeout_s,
        "failure_reasons": failure_reasons(run),
    }


def detailed(run: BenchRun) -> dict[str, Any]:
    """vLLM's ``--save-detailed`` per-request lists (seconds), plus the agent and turn of each."""
    res = run.results
    return {
        "input_lens": [r.prompt_len for r in res],
        "output_lens": [r.num_generated if r.ok else 0 for r in res],
        "ttfts": [r.ttft_s or 0.0 for r in res],
        "itls": [r.itls_s for r in res],
        "latencies": [r.e2e_s or 0.0 for r in res],
        "start_times": [r.sent_s for r in res],
        "errors": [r.error or "" for r in res],
        "agents": [r.agent_index for r in res],
        "turns": [r.turn_index for r in res],
    }


def cdf_figure(run: BenchRun) -> Any:
    """CDFs of TTFT, TPOT (SLO lines dashed) and JCT (E2EL without agents) as one matplotlib
    figure (the caller closes it). A panel without samples says so in text on its axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = run.config
    last = ("JCT (s)", "jct") if run.agents else ("E2EL (s)", "e2el")
    series = [
        ("TTFT (s)", "ttft", 1.0, cfg.ttft_slo_s),
        ("TPOT (ms)", "tpot", 1e3, cfg.tpot_slo_s * 1e3),
        (last[0], last[1], 1.0, None),
    ]
    failed = sum(not r.ok for r in run.results)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, (label, name, unit, slo) in zip(axes, series):
        vals = np.sort(np.asarray(metric_values(run, name), dtype=float) * unit)
        if vals.size:
            ax.step(vals, np.arange(1, vals.size + 1) / vals.size, where="post")
            if slo is not None:
                ax.axvline(slo, linestyle="--", color="gray", label="SLO")
                ax.legend(loc="lower right")
        else:
            why = (
                f"no data: {failed} of {len(run.results)} requests failed"
                if failed
                else "no data (one-token answers have no TPOT)"
                if name == "tpot"
                else "no data"
            )
            ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, wrap=True)
            ax.set_xticks([])
            ax.set_yticks([])
        ax.set_xlabel(label)
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3)
    who = f"{len(run.agents)} agents" if run.agents else f"{len(run.results)} requests ({cfg.dataset_name})"
    fig.suptitle(f"dualpath bench: {who}, {cfg.mode}, {run.endpoint.model}")
    fig.tight_layout()
    return fig


def plot_cdfs(run: BenchRun, path: Path) -> Path:
    """``cdf_figure`` written to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    fig = cdf_figure(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

"""Summaries of a benchmark run: latency percentiles, SLO attainment, throughput; CDF plot.

SLO attainment (paper, section 6): the fraction of successful requests with TTFT <= ``ttft_slo_s``
and TPOT <= ``tpot_slo_s`` (a one-token request has no TPOT and meets that part). Failed
requests count against attainment. Percentiles are over successful requests; JCT over agents that
finished every turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dualpath.bench.client import TurnResult
from dualpath.bench.runner import BenchRun, describe

PERCENTILES = (50, 90, 99)
METRICS = ("ttft_s", "ttst_s", "tpot_s", "e2e_s")


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    """count, mean, p50, p90, p99, max (None when empty)."""
    if not values:
        return {"count": 0, "mean": None, **{f"p{p}": None for p in PERCENTILES}, "max": None}
    arr = np.asarray(values, dtype=float)
    out: dict[str, float | int | None] = {"count": int(arr.size), "mean": float(arr.mean())}
    out.update({f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES})
    out["max"] = float(arr.max())
    return out


def _ok(res: TurnResult) -> bool:
    return res.error is None and bool(res.token_times_s)


def _meets(res: TurnResult, ttft_slo_s: float, tpot_slo_s: float) -> bool:
    tpot = res.tpot_s
    return (_ok(res) and res.ttft_s is not None and res.ttft_s <= ttft_slo_s
            and (tpot is None or tpot <= tpot_slo_s))


def summarize(run: BenchRun) -> dict[str, Any]:
    """One JSON-ready object describing the run."""
    cfg = run.config
    ok = [r for r in run.results if _ok(r)]
    failed = [r for r in run.results if not _ok(r)]
    jcts = [v for v in run.jct_s.values() if v is not None]
    n = len(run.results)
    gen = sum(r.num_generated for r in ok)
    prompt = sum(r.prompt_len for r in ok)
    wall = max(run.wall_s, 1e-9)
    latency = {m: percentiles([v for r in ok if (v := getattr(r, m)) is not None]) for m in METRICS}
    return {
        **describe(run),
        "wall_s": run.wall_s,
        "num_requests": n,
        "num_ok": len(ok),
        "num_failed": len(failed),
        "num_429_retries": sum(r.num_429 for r in run.results),
        "num_agents_finished": len(jcts),
        "exact_token_ids": run.exact_token_ids,
        "latency_s": latency,
        "jct_s": percentiles(jcts),
        "slo": {"ttft_slo_s": cfg.ttft_slo_s, "tpot_slo_s": cfg.tpot_slo_s,
                "attainment": sum(_meets(r, cfg.ttft_slo_s, cfg.tpot_slo_s) for r in run.results) / max(n, 1),
                "ttft_attainment": sum(_meets(r, cfg.ttft_slo_s, float("inf")) for r in run.results) / max(n, 1),
                "tpot_attainment": sum(_meets(r, float("inf"), cfg.tpot_slo_s) for r in run.results) / max(n, 1)},
        "throughput": {"requests_per_s": len(ok) / wall, "generated_tokens_per_s": gen / wall,
                       "prompt_tokens_per_s": prompt / wall,
                       "agents_per_s": len(jcts) / wall},
        "errors": sorted({r.error for r in failed if r.error})[:5],
    }


def request_rows(run: BenchRun) -> list[dict[str, Any]]:
    """Per-request records (for requests.jsonl)."""
    return [{"agent": r.agent_index, "turn": r.turn_index, "prompt_len": r.prompt_len,
             "gen_len": r.gen_len, "num_generated": r.num_generated, "sent_s": r.sent_s,
             "ttft_s": r.ttft_s, "ttst_s": r.ttst_s, "tpot_s": r.tpot_s, "e2e_s": r.e2e_s,
             "num_429": r.num_429, "error": r.error} for r in run.results]


def plot_cdfs(run: BenchRun, path: Path) -> Path:
    """CDFs of TTFT, TPOT (SLO lines dashed) and JCT, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in run.results if _ok(r)]
    series: list[tuple[str, list[float | None], float | None]] = [
        ("TTFT (s)", [r.ttft_s for r in ok], run.config.ttft_slo_s),
        ("TPOT (ms)", [r.tpot_s * 1e3 for r in ok if r.tpot_s is not None],
         run.config.tpot_slo_s * 1e3),
        ("JCT (s)", [v for v in run.jct_s.values() if v is not None], None)]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, (label, values, slo) in zip(axes, series):
        vals = np.sort(np.array([v for v in values if v is not None], dtype=np.float64))
        if vals.size:
            ax.step(vals, np.arange(1, vals.size + 1) / vals.size, where="post")
        if slo is not None:
            ax.axvline(slo, linestyle="--", color="gray", label="SLO")
            ax.legend(loc="lower right")
        ax.set_xlabel(label)
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3)
    fig.suptitle(f"dualpath bench: {run.config.num_agents} agents, {run.config.mode}, "
                 f"{run.endpoint.model}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

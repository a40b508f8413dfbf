"""Systems compared on one server: a bench run per system between two scrapes of ``/metrics``.

``dualpath demo`` and ``benchmarks/dualpath_throughput.py`` switch a ``dualpath serve`` cluster's
policy between runs and measure each system as ``dualpath bench`` would (the same client, the same
HTTP API); what the client cannot see (bytes per KV path and per NIC, the read side of each
request) comes from the server's Prometheus counters, read ``settle_s`` before the run starts and
``settle_s`` after it ends (engines report their byte counters by heartbeat). The row keys are the
ones ``dualpath demo --json`` prints.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from dualpath.bench.client import TurnResult
from dualpath.bench.config import BenchConfig
from dualpath.bench.runner import BenchRun, run_bench
from dualpath.bench.server_metrics import by_label, parse_series, scrape_text

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]
# the server's counters (runtime/server/metrics.py) -> (row key, label)
COUNTERS = {
    "bytes_by_path": ("dualpath_kv_bytes_total", "path"),
    "bytes_by_nic": ("dualpath_nic_bytes_total", "nic"),
    "read_sides": ("dualpath_requests_by_read_side_total", "side"),
}


async def _series(url: str, tries: int = 5) -> Series:
    """The server's counters; asked again (1 s apart) while it says the cluster did not answer
    (``dualpath_cluster_up`` 0: the counters would be an older snapshot's)."""
    series: Series = {}
    async with httpx.AsyncClient() as http:
        for attempt in range(tries):
            text = await scrape_text(http, url)
            series = parse_series(text) if text is not None else {}
            if series.get(("dualpath_cluster_up", ()), 1.0) == 1.0:
                break
            if attempt + 1 < tries:
                await asyncio.sleep(1.0)
    return series


def counter_deltas(before: Series, after: Series) -> dict[str, dict[str, int]]:
    """Per row key of ``COUNTERS``: label value -> counter increase between the scrapes."""
    out = {}
    for key, (name, label) in COUNTERS.items():
        a, b = by_label(before, name, label), by_label(after, name, label)
        out[key] = {k: int(round(b.get(k, 0.0) - a.get(k, 0.0))) for k in sorted(set(a) | set(b))}
    return out


def system_row(run: BenchRun, counters: dict[str, dict[str, int]]) -> dict[str, Any]:
    """One system's results: JCT (the run's wall time: every agent starts at once), TTFT mean and
    p90 over answered requests, the store hit rate, read sides, bytes per path and per storage NIC
    read (``node<i>``), generated tokens and every failure message."""
    ok: list[TurnResult] = [r for r in run.results if r.ok]
    ttft = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
    hit = run.cache.hit_rate if run.cache is not None else None
    nic = counters["bytes_by_nic"]
    return {
        "jct_s": run.wall_s,
        "ttft_mean_s": sum(ttft) / len(ttft) if ttft else None,
        "ttft_p90_s": ttft[int(0.9 * (len(ttft) - 1))] if ttft else None,
        "num_requests": len(ok),
        "hit_rate": hit or 0.0,
        "read_sides": counters["read_sides"],
        "snic_read_bytes": {k.split("/")[0]: v for k, v in nic.items() if k.endswith(":read")},
        "bytes_by_path": counters["bytes_by_path"],
        "generated_tokens": sum(r.num_generated for r in ok),
        "errors": [r.error or "no tokens" for r in run.results if not r.ok],
    }


async def measure_system(
    cfg: BenchConfig, *, settle_s: float = 0.5, on_turn: Callable[[TurnResult], None] | None = None
) -> tuple[BenchRun, dict[str, Any]]:
    """Run ``cfg`` (``run_bench``) between two scrapes; (the run, its row of ``system_row``)."""
    await asyncio.sleep(settle_s)
    before = await _series(cfg.url)
    run = await run_bench(cfg, on_turn=on_turn)
    await asyncio.sleep(settle_s)
    return run, system_row(run, counter_deltas(before, await _series(cfg.url)))


def ratios(rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    """JCT ratios: basic/dualpath (speedup; ideal 3x at 1P2D when reads bind) and dualpath/oracle."""
    jct = {k: float(v["jct_s"]) for k, v in rows.items()}
    out = {}
    if "basic" in jct and "dualpath" in jct:
        out["dualpath_speedup_over_basic"] = jct["basic"] / jct["dualpath"]
    if "oracle" in jct and "dualpath" in jct:
        out["dualpath_jct_over_oracle"] = jct["dualpath"] / jct["oracle"]
    return out

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
from collections.abc import Awaitable, Callable
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


def counter_deltas(
    before: Series, after: Series, resets: list[str] | None = None
) -> dict[str, dict[str, int]]:
    """Per row key of ``COUNTERS``: label value -> counter increase between the scrapes. A counter
    lower in ``after`` was reset (the server restarted): its increase is its new value, as
    Prometheus' ``increase()`` takes it, and its name is appended to ``resets``."""
    out = {}
    for key, (name, label) in COUNTERS.items():
        a, b = by_label(before, name, label), by_label(after, name, label)
        row = {}
        for k in sorted(set(a) | set(b)):
            was, now = a.get(k, 0.0), b.get(k, 0.0)
            if now < was and resets is not None:
                resets.append(f"{name}{{{label}={k!r}}}")
            row[k] = int(round(now - was if now >= was else now))
        out[key] = row
    return out


def add_deltas(total: dict[str, dict[str, int]], more: dict[str, dict[str, int]]) -> None:
    """``total`` += ``more`` (rows of ``counter_deltas``), in place."""
    for key, row in more.items():
        acc = total.setdefault(key, {})
        for k, v in row.items():
            acc[k] = acc.get(k, 0) + v


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


async def measure_interleaved(
    cfgs: dict[str, BenchConfig], switch: Callable[[str], Awaitable[None]], *, settle_s: float = 0.5
) -> dict[str, tuple[BenchRun, dict[str, Any]]]:
    """Run the systems of ``cfgs`` (agents datasets, one server) round by round (``rounds.py``):
    in round ``k`` each system, after ``await switch(name)`` reconfigured the server for it, runs
    turn ``k`` of its agents; the order rotates by one system per round so none always goes first.
    Counters are scraped around each system's round (``settle_s`` after it) and summed per system.
    {name: (its run, its row of ``system_row``, with ``counter_resets``)}."""
    from dualpath.bench.rounds import RoundRun
    from dualpath.bench.server_metrics import CacheHits, cache_hits, scrape

    names = list(cfgs)
    url = cfgs[names[0]].url
    runs = {n: RoundRun(c) for n, c in cfgs.items()}
    counters: dict[str, dict[str, dict[str, int]]] = {n: {} for n in names}
    resets: dict[str, list[str]] = {n: [] for n in names}
    hits: dict[str, list[CacheHits]] = {n: [] for n in names}
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0)) as http:
        for r in runs.values():
            await r.open(http)
        await asyncio.sleep(settle_s)
        series, plain = await _series(url), await scrape(http, url)
        for k in range(max(r.num_rounds for r in runs.values())):
            for name in names[k % len(names) :] + names[: k % len(names)]:
                if k >= runs[name].num_rounds:
                    continue
                await switch(name)
                await runs[name].round(k, http)
                await asyncio.sleep(settle_s)
                after, after_plain = await _series(url), await scrape(http, url)
                add_deltas(counters[name], counter_deltas(series, after, resets[name]))
                if (h := cache_hits(plain, after_plain)) is not None:
                    hits[name].append(h)
                series, plain = after, after_plain
    out = {}
    for name, r in runs.items():
        run = r.run
        assert run is not None
        if hits[name]:
            h0 = hits[name][0]
            run.cache = CacheHits(
                source=h0.source,
                hit_tokens=sum(h.hit_tokens for h in hits[name]),
                query_tokens=sum(h.query_tokens for h in hits[name]),
            )
        full = {key: counters[name].get(key, {}) for key in COUNTERS}
        out[name] = (run, system_row(run, full) | {"counter_resets": sorted(set(resets[name]))})
    return out


def ratios(rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    """JCT ratios: basic/dualpath (speedup; ideal 3x at 1P2D when reads bind) and dualpath/oracle."""
    jct = {k: float(v["jct_s"]) for k, v in rows.items()}
    out = {}
    if "basic" in jct and "dualpath" in jct:
        out["dualpath_speedup_over_basic"] = jct["basic"] / jct["dualpath"]
    if "oracle" in jct and "dualpath" in jct:
        out["dualpath_jct_over_oracle"] = jct["dualpath"] / jct["oracle"]
    return out

"""The ``dualpath simulate`` console tables (offline JCT, online capacity), with units and legends."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from dualpath.cli._common import print_table

OFFLINE_COLUMNS = (
    "system",
    "JCT (s)",
    "TTFT mean (s)",
    "TTST mean (s)",
    "TPOT mean (ms)",
    "cluster throughput (req/sim-s)",
    "SNIC max/avg (x)",
    "sim speed (req/wall-s)",
)
BREAKDOWN_COLUMNS = ("system", "scheduling (s)", "allocation (s)", "KV reading (s)", "prefill (s)")
ONLINE_COLUMNS = (
    "system",
    "capacity (agents/s)",
    "TTFT mean at capacity (s)",
    "TTST mean at capacity (s)",
    "TPOT mean at capacity (ms)",
)
OFFLINE_LEGEND = (
    "JCT: simulated time until the last agent finishes. cluster throughput: requests (turns) "
    "finished per simulated second.",
    "SNIC max/avg: bytes through the busiest node's storage NIC over the mean across nodes (1 = balanced).",
    "sim speed: how fast this machine ran the simulator, requests per wall-clock second (not the "
    "cluster's throughput).",
)


def _ms(value: Any) -> float | None:
    return None if value is None else float(value) * 1e3


def print_offline(
    result: dict[str, Any], model: str, pd_label: str, maxlen: str, out: Console | None = None
) -> None:
    """Main table (JCT, latencies, throughput, balance, sim speed) and the TTFT breakdown."""
    rows, parts = [], []
    for name, r in result["systems"].items():
        rows.append(
            (
                name,
                r["jct_s"],
                r["mean_ttft_s"],
                r.get("mean_ttst_s"),
                _ms(r["mean_tpot_s"]),
                r.get("requests_per_sim_s"),
                r["snic_max_over_avg"],
                r["requests_per_wall_s"],
            )
        )
        bd = r["ttft_breakdown_s"]
        parts.append((name, bd["scheduling"], bd["allocation"], bd["reading"], bd["prefill"]))
    print_table(
        f"offline JCT: {model} {pd_label}, MaxLen {maxlen}, {result['agents']} agents",
        OFFLINE_COLUMNS,
        rows,
        out=out,
    )
    print_table("TTFT breakdown (mean per request)", BREAKDOWN_COLUMNS, parts, legend=OFFLINE_LEGEND, out=out)


def print_online(result: dict[str, Any], model: str, pd_label: str, out: Console | None = None) -> None:
    """Capacity per system and the latencies at that rate."""
    from dualpath.sim.harness.online import TPOT_SLO_S, TTFT_SLO_S

    rows = [
        (n, r["capacity_aps"], _last(r, "ttft_mean_s"), _last(r, "ttst_mean_s"), _ms(_last(r, "tpot_mean_s")))
        for n, r in result["systems"].items()
    ]
    legend = (
        f"capacity: the highest agent arrival rate swept whose run met the SLO (TTFT <= "
        f"{TTFT_SLO_S:g} s, TPOT <= {TPOT_SLO_S * 1e3:g} ms); '-' when no rate met it.",
    )
    print_table(f"online capacity: {model} {pd_label}", ONLINE_COLUMNS, rows, legend=legend, out=out)


def _last(sweep: dict[str, Any], key: str) -> Any:
    ok = [p for p in sweep["points"] if p["meets_slo"]]
    return ok[-1][key] if ok else None

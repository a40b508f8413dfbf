"""The ``dualpath demo`` console report: what each system is, three narrow tables, the ratios.

The expected ratios are what ``dualpath demo`` measured on the project's 2-core CPU machine
(shared with other jobs; docs/cluster.md "Measured here"); other hardware moves them.
"""

from __future__ import annotations

import textwrap
from typing import Any

from rich.console import Console

from dualpath.cli._common import console, print_table

SYSTEM_NOTES = {
    "basic": "Basic: every request's cached KV is read by the prefill engine (PE read path only), "
    "so one storage NIC feeds the cluster.",
    "dualpath": "DualPath: the scheduler picks the PE or the DE (decode engine) read path per "
    "request, so every node's storage NIC reads.",
    "oracle": "Oracle: DualPath whose storage reads and PD transfers take no time (bytes are "
    "still counted, compute is real): the upper bound.",
    "rr-shorter-queue": "rr-shorter-queue: round-robin engines, read on the side with the "
    "shorter read queue.",
    "always-de": "always-de: every request's cached KV is read by the decode engine.",
    "dualpath-split": "dualpath-split: DualPath that may split one request's read across both sides.",
}
# JCT (s) of each run of `dualpath demo` (default options) on the project's 2-core CPU machine,
# 2026-11/12; the expected ratios printed are the range over these runs. The third SmolLM2 run had
# ~6 other jobs on the two cores (load average 9): ratios drop when the CPU is shared.
MEASURED_JCT_S: dict[str, list[dict[str, float]]] = {
    "smollm2-135m": [
        {"basic": 66.4, "dualpath": 30.2, "oracle": 17.6},
        {"basic": 63.3, "dualpath": 28.9, "oracle": 21.2},
        {"basic": 76.3, "dualpath": 45.7, "oracle": 31.5},
    ],
    "tiny": [
        {"basic": 21.5, "dualpath": 11.4, "oracle": 3.0},
        {"basic": 21.5, "dualpath": 8.79, "oracle": 2.69},
    ],
}
RATIO_TEXT = {
    "dualpath_speedup_over_basic": (
        "DualPath speedup over Basic (JCT Basic / JCT DualPath)",
        ("basic", "dualpath"),
        "ideal 3x at 1P2D: three storage NICs read instead of one; less when other jobs share the CPU",
    ),
    "dualpath_jct_over_oracle": (
        "DualPath JCT over Oracle's (1 = no I/O cost left)",
        ("dualpath", "oracle"),
        "Oracle also skips PD transfers",
    ),
}


def print_demo(
    result: dict[str, Any], model: str, snic_gbps: float, agents: int, out: Console | None = None
) -> None:
    """Print the systems' one-line descriptions, the latency, bytes and storage-NIC tables and the
    ratios with what to expect."""
    con = out if out is not None else console
    systems: dict[str, dict[str, Any]] = result["systems"]
    con.print(
        f"dualpath demo: {model}, 1 prefill + 2 decode engines (one node each), storage "
        f"NIC capped at {snic_gbps:g} Gbit/s per node, {agents} agents.",
        highlight=False,
    )
    for name in systems:
        if name in SYSTEM_NOTES:
            con.print(
                textwrap.fill(
                    SYSTEM_NOTES[name], width=con.width, initial_indent="  ", subsequent_indent="  "
                ),
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
    lat = []
    for name, r in systems.items():
        sides = r.get("read_sides", {})
        lat.append(
            (
                name,
                r["jct_s"],
                r["ttft_mean_s"],
                r["ttft_p90_s"],
                r["num_requests"],
                f"{sides.get('pe', 0)}/{sides.get('de', 0)}",
                100.0 * r["hit_rate"],
                len(r["errors"]),
            )
        )
    print_table(
        "Latency per system",
        (
            "system",
            "JCT (s)",
            "TTFT mean (s)",
            "TTFT p90 (s)",
            "requests",
            "read side PE/DE (requests)",
            "store hit rate (%)",
            "errors",
        ),
        lat,
        out=con,
    )
    paths = ("pe-read", "de-read", "pd-transfer", "persist")
    moved = [(name, *(r["bytes_by_path"].get(p, 0) / 1e6 for p in paths)) for name, r in systems.items()]
    print_table(
        "KV bytes moved per path (MB = 1e6 bytes)",
        ("system", "PE read (MB)", "DE read (MB)", "PD transfer (MB)", "persist (MB)"),
        moved,
        out=con,
    )
    nodes = sorted({n for r in systems.values() for n in r["snic_read_bytes"]}, key=lambda n: (len(n), n))
    reads = [(name, *(r["snic_read_bytes"].get(n, 0) / 1e6 for n in nodes)) for name, r in systems.items()]
    num_pe_nodes = int(result.get("config", {}).get("num_prefill_engines", 1))
    role = {n: "PE" if i < num_pe_nodes else "DE" for i, n in enumerate(nodes)}
    print_table(
        "Storage reads per node's storage NIC (MB)",
        ("system", *(f"{n} {role[n]} (MB)" for n in nodes)),
        reads,
        legend=(
            "PE read: prefill engine loads cached KV; DE read: decode engine loads "
            "it and sends it to the PE; PD transfer: KV from PE to DE after prefill; "
            "persist: new KV written to the store.",
        ),
        out=con,
    )
    for line in ratio_lines(result["ratios"], model):
        con.print(line, highlight=False, markup=False)


def expected_range(model: str, num: str, den: str) -> tuple[float, float] | None:
    """(lowest, highest) JCT ratio num/den over the reference runs, None when none has both."""
    runs = [r[num] / r[den] for r in MEASURED_JCT_S.get(model, []) if num in r and den in r]
    return (min(runs), max(runs)) if runs else None


def ratio_lines(ratios: dict[str, float], model: str) -> list[str]:
    """One line per ratio, with what the reference machine measured when known."""
    lines = []
    for key, value in ratios.items():
        text, (num, den), note = RATIO_TEXT.get(key, (key, ("", ""), ""))
        span = expected_range(model, num, den)
        expect = ""
        if span is not None:
            lo, hi = span
            shown = f"{lo:.1f}x" if round(lo, 1) == round(hi, 1) else f"{lo:.1f}-{hi:.1f}x"
            expect = f"; earlier runs on a 2-core CPU: {shown}"
        lines.append(f"{text}: {value:.2f}x{expect}" + (f" ({note})" if note else ""))
    return lines

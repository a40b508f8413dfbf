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
# shared with other jobs, with the systems' rounds interleaved (bench.systems.measure_interleaved;
# a system's JCT is the sum of its rounds). 2026-12-03: SmolLM2 at load average 7-9 and 4-7,
# tiny at 5-7, 4-6 and 6-9. The expected ratios printed (and the README's) are the range over these.
MEASURED_JCT_S: dict[str, list[dict[str, float]]] = {
    "smollm2-135m": [
        {"basic": 59.5, "dualpath": 37.0, "oracle": 30.1},
        {"basic": 59.3, "dualpath": 33.2, "oracle": 23.1},
    ],
    "tiny": [
        {"basic": 22.99, "dualpath": 10.9, "oracle": 3.58},
        {"basic": 23.44, "dualpath": 11.03, "oracle": 3.58},
        {"basic": 23.68, "dualpath": 11.66, "oracle": 3.44},
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
    _print_intro(result, model, snic_gbps, agents, con)
    _print_latency(result["systems"], con)
    _print_bytes(result, con)
    for line in comparison_lines(result, model):
        con.print(line, highlight=False, markup=False)


def _print_intro(result: dict[str, Any], model: str, snic_gbps: float, agents: int, con: Console) -> None:
    """The setting, what makes the runs not comparable (first), each system's one-line note."""
    systems: dict[str, dict[str, Any]] = result["systems"]
    con.print(
        f"dualpath demo: {model}, 1 prefill + 2 decode engines (one node each), storage "
        f"NIC capped at {snic_gbps:g} Gbit/s per node, {agents} agents.",
        highlight=False,
    )
    for line in problem_lines(result):
        con.print(line, style="bold red", highlight=False, markup=False)
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


def _print_latency(systems: dict[str, dict[str, Any]], con: Console) -> None:
    """One row per system: JCT, TTFT, requests, read sides, store hit rate, errors."""
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


def _print_bytes(result: dict[str, Any], con: Console) -> None:
    """KV bytes moved per path, and storage reads per node's storage NIC."""
    systems: dict[str, dict[str, Any]] = result["systems"]
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


def problem_lines(result: dict[str, Any]) -> list[str]:
    """What makes the systems' runs not comparable, and bounds that came out as noise; first."""
    comp = result.get("comparison", {})
    lines = [f"NOT COMPARABLE: {p}" for p in comp.get("problems", [])]
    return lines + [f"NOISE: {n}" for n in comp.get("noise", [])]


def comparison_lines(result: dict[str, Any], model: str) -> list[str]:
    """The ratios: JCT ratios when every system did the same work; otherwise only the summed
    latency over the requests all of them finished (or a line saying there is none)."""
    comp = result.get("comparison", {})
    if comp.get("same_work", True):
        return ratio_lines(result["ratios"], model)
    lines = ["No JCT ratio: the systems did different work (see NOT COMPARABLE above)."]
    n = comp.get("common_requests", 0)
    if not n:
        return lines + ["No request was finished by every system: no ratio at all."]
    for key, value in comp.get("common_ratios", {}).items():
        text = RATIO_TEXT.get(key, (key, ("", ""), ""))[0].replace("JCT", "summed request latency")
        lines.append(f"Over the {n} requests every system finished, {text}: {value:.2f}x (not the JCT)")
    return lines


def expected_range(model: str, num: str, den: str) -> tuple[float, float] | None:
    """(lowest, highest) JCT ratio num/den over the reference runs, None when none has both."""
    runs = [r[num] / r[den] for r in MEASURED_JCT_S.get(model, []) if num in r and den in r]
    return (min(runs), max(runs)) if runs else None


def range_text(model: str, num: str, den: str) -> str | None:
    """The expected range of JCT ratio num/den as printed ("1.7-2.2x"), from ``MEASURED_JCT_S``:
    the one place the demo's report and the README (``README_EXPECTATION``, checked by a test)
    take it from."""
    span = expected_range(model, num, den)
    if span is None:
        return None
    lo, hi = span
    return f"{lo:.1f}x" if round(lo, 1) == round(hi, 1) else f"{lo:.1f}-{hi:.1f}x"


def readme_expectation(model: str = "smollm2-135m") -> str:
    """The README's sentence on what ``dualpath demo`` shows (tests/cli/test_output.py checks
    the README holds exactly this)."""
    return (
        f"Expect DualPath's JCT {range_text(model, 'basic', 'dualpath')} shorter than Basic's (3x is "
        "the ideal at 1P2D, three storage NICs instead of one) and within "
        f"{range_text(model, 'dualpath', 'oracle')} of Oracle's."
    )


def ratio_lines(ratios: dict[str, float], model: str) -> list[str]:
    """One line per ratio, with what the reference machine measured when known."""
    lines = []
    for key, value in ratios.items():
        text, (num, den), note = RATIO_TEXT.get(key, (key, ("", ""), ""))
        shown = range_text(model, num, den)
        expect = f"; earlier runs on a 2-core CPU: {shown}" if shown is not None else ""
        lines.append(f"{text}: {value:.2f}x{expect}" + (f" ({note})" if note else ""))
    return lines

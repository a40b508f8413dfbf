"""Readable console output: units in headers, tables that fit 80 columns, progress lines in logs."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading

import pytest
from rich.console import Console

from dualpath.cli._common import column_groups, fit_widths, print_table
from dualpath.cli.demo_tables import expected_range, print_demo
from dualpath.cli.progress import Progress
from dualpath.cli.sim_tables import (
    BREAKDOWN_COLUMNS,
    OFFLINE_COLUMNS,
    ONLINE_COLUMNS,
    print_offline,
    print_online,
)

UNIT = re.compile(
    r"\((s|ms|x|%|MB|GB|GB/s|Gbit/s|TFLOPS|tokens|requests|agents/s|req/[a-z-]+|"
    r"bytes/token/layer|GFLOP/token|GB/PFLOP|PFLOP|billions|W|fraction|"
    r"bytes/kFLOP|prefill/decode nodes|act\+shared /routed)\)"
)


def _render(fn, width: int) -> str:
    con = Console(width=width, file=io.StringIO(), force_terminal=False, color_system=None)
    fn(con)
    return con.file.getvalue()


def _assert_fits(text: str, width: int) -> None:
    lines = text.splitlines()
    assert lines and max(len(ln) for ln in lines) <= width, max(lines, key=len)
    assert "…" not in text  # rich cut a cell


# -- a canned result of each command (the shapes run_one / capacity_sweep / run_demo return) ------


def _offline() -> dict:
    def one(name: str, jct: float) -> dict:
        return {
            "jct_s": jct,
            "mean_ttft_s": 0.1957,
            "mean_ttst_s": 0.06197,
            "mean_tpot_s": 0.03631,
            "num_requests": 3072,
            "requests_per_sim_s": 3072 / jct,
            "snic_max_over_avg": 2.877,
            "requests_per_wall_s": 12452.9,
            "ttft_breakdown_s": {
                "scheduling": 0.025,
                "allocation": 0.0,
                "reading": 0.0519,
                "prefill": 0.1188,
            },
        }

    return {
        "agents": 16,
        "systems": {
            "basic": one("basic", 1308.4),
            "dualpath": one("dp", 1234.25),
            "oracle": one("oracle", 1192.0),
        },
    }


def _online() -> dict:
    point = {"meets_slo": True, "ttft_mean_s": 0.4386, "ttst_mean_s": 0.04493, "tpot_mean_s": 0.0357}
    return {
        "systems": {
            "basic": {"capacity_aps": 0.1, "points": [point]},
            "dualpath": {"capacity_aps": 0.0, "points": [{**point, "meets_slo": False}]},
        }
    }


def _demo() -> dict:
    def one(jct: float, pe: float, de: float) -> dict:
        return {
            "jct_s": jct,
            "ttft_mean_s": 3.095,
            "ttft_p90_s": 6.048,
            "num_requests": 36,
            "hit_rate": 0.7633,
            "read_sides": {"pe": 12, "de": 18},
            "snic_read_bytes": {"node0": pe, "node1": de / 2, "node2": de / 2},
            "bytes_by_path": {"pe-read": pe, "de-read": de, "pd-transfer": 757.2e6, "persist": 141.6e6},
            "errors": [],
        }

    systems = {
        "basic": one(63.29, 578e6, 0),
        "dualpath": one(28.86, 215.3e6, 362.7e6),
        "oracle": one(21.22, 412.9e6, 165.2e6),
    }
    return {
        "config": {"num_prefill_engines": 1},
        "systems": systems,
        "ratios": {"dualpath_speedup_over_basic": 63.29 / 28.86, "dualpath_jct_over_oracle": 28.86 / 21.22},
    }


# -- units and names ----------------------------------------------------------------------------


@pytest.mark.parametrize("columns", [OFFLINE_COLUMNS, BREAKDOWN_COLUMNS, ONLINE_COLUMNS])
def test_simulate_headers_carry_units(columns: tuple[str, ...]) -> None:
    assert columns[0] == "system"
    for header in columns[1:]:
        assert UNIT.search(header), header


def test_simulate_tells_simulator_speed_from_cluster_throughput() -> None:
    text = _render(lambda c: print_offline(_offline(), "deepseek-v3.2", "2P4D", "64k", out=c), 200)
    assert "sim speed (req/wall-s)" in text and "cluster throughput (req/sim-s)" in text
    assert "req/s " not in text and "SNIC m/a" not in text
    assert "SNIC max/avg: bytes through the busiest node's storage NIC" in text  # the legend
    assert "2.489" in text  # 3072 requests / 1234.25 simulated seconds


def test_cli_tables_have_units_end_to_end() -> None:
    out = _run_cli("simulate", "--agents", "4", "--system", "basic,dualpath", columns=200).stdout
    for header in ("JCT (s)", "TTFT mean (s)", "TPOT mean (ms)", "KV reading (s)", "sim speed (req/wall-s)"):
        assert header in out, header
    models = _run_cli("models", columns=200).stdout
    assert "KV (bytes/token/layer)" in models and "KVH" not in models
    hw = _run_cli("hardware", columns=200).stdout
    assert "storage NIC (Gbit/s)" in hw and "HBM (GB/s)" in hw


def test_demo_says_what_each_system_is_and_what_to_expect() -> None:
    text = _render(lambda c: print_demo(_demo(), "smollm2-135m", 0.1, 6, out=c), 200)
    assert "Basic: every request's cached KV is read by the prefill engine" in text
    assert "DualPath: the scheduler picks the PE or the DE" in text
    assert "Oracle: DualPath whose storage reads and PD transfers take no time" in text
    lo, hi = expected_range("smollm2-135m", "basic", "dualpath")
    assert 1.5 < lo <= hi < 3.0
    assert (
        f"DualPath speedup over Basic (JCT Basic / JCT DualPath): 2.19x; earlier runs on a "
        f"2-core CPU: {lo:.1f}-{hi:.1f}x" in text
    )
    for header in (
        "JCT (s)",
        "TTFT p90 (s)",
        "PE read (MB)",
        "node0 PE (MB)",
        "node2 DE (MB)",
        "store hit rate (%)",
    ):
        assert header in text, header
    assert expected_range("no-such-model", "basic", "dualpath") is None


def test_the_readme_states_the_demos_own_ranges() -> None:
    """One range, in one place (``MEASURED_JCT_S``): the README's sentence is the report's."""
    from pathlib import Path

    from dualpath.cli.demo_tables import readme_expectation

    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert readme_expectation() in readme, readme_expectation()


# -- width ------------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [80, 120])
def test_tables_fit_the_console(width: int) -> None:
    for fn in (
        lambda c: print_offline(_offline(), "deepseek-v3.2", "2P4D", "64k", out=c),
        lambda c: print_online(_online(), "deepseek-v3.2", "2P4D", out=c),
        lambda c: print_demo(_demo(), "smollm2-135m", 0.1, 6, out=c),
    ):
        _assert_fits(_render(fn, width), width)
    # numbers are never folded across lines
    offline = _render(lambda c: print_offline(_offline(), "m", "2P4D", "64k", out=c), width)
    assert "1308" in offline and "12,453" in offline
    demo = _render(lambda c: print_demo(_demo(), "smollm2-135m", 0.1, 6, out=c), width)
    assert "757.2" in demo and "63.29" in demo and "12/18" in demo


def test_wide_table_splits_and_repeats_the_key_column() -> None:
    cols = ["system", *(f"column number {i} (s)" for i in range(12))]
    rows = [["dualpath", *(1000.0 + i for i in range(12))], ["basic", *range(12)]]
    text = _render(lambda c: print_table("wide", cols, rows, out=c), 80)
    _assert_fits(text, 80)
    assert "wide (1/" in text and text.count("dualpath") >= 2  # each part names its rows
    assert all(f"{1000 + i}" in text for i in range(12))
    assert len(column_groups(cols, [[str(v) for v in r] for r in rows], 1000)) == 1


def test_fit_widths_stays_within_bounds() -> None:
    lo, hi = [6, 4, 10], [8, 20, 10]
    widths = fit_widths(lo, hi, 40)
    assert all(a <= w <= b for a, w, b in zip(lo, widths, hi))
    assert sum(widths) + 3 * 3 + 1 <= 40


@pytest.mark.parametrize("columns", [80, 120])
def test_cli_output_fits_columns(columns: int) -> None:
    for args in (
        ("simulate", "--agents", "4", "--system", "basic,dualpath"),
        ("models",),
        ("hardware",),
        ("plan", "pd-range"),
        ("plan", "trend"),
        ("workload", "stats", "--num", "20"),
    ):
        _assert_fits(_run_cli(*args, columns=columns).stdout, columns)


# -- progress ---------------------------------------------------------------------------------


def _run_cli(*args: str, columns: int = 80, progress_s: str = "5") -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(columns), "DUALPATH_PROGRESS_S": progress_s}
    proc = subprocess.run(
        [sys.executable, "-m", "dualpath.cli", *args], capture_output=True, text=True, env=env, timeout=240
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def test_piped_simulate_prints_plain_progress_lines() -> None:
    proc = _run_cli("simulate", "--agents", "4", "--system", "basic,dualpath", progress_s="0")
    lines = proc.stderr.splitlines()
    assert any(
        re.fullmatch(r"\[1/2\] simulating dualpath \(4 agents\) \.\.\. \d+ s elapsed", ln) for ln in lines
    ), lines
    assert re.fullmatch(r"\[2/2\] .* s elapsed, done", lines[-1]), lines
    assert "\x1b[" not in proc.stderr  # no terminal control codes in a log
    assert "[1/2]" not in proc.stdout  # progress stays off stdout


def test_piped_online_sweep_names_the_rate() -> None:
    proc = _run_cli(
        "simulate",
        "--online",
        "--aps",
        "0.05,0.1",
        "--horizon",
        "30",
        "--system",
        "dualpath",
        "--maxlen",
        "32k",
        progress_s="0",
    )
    assert "[0/2] online dualpath aps=0.05 ..." in proc.stderr
    assert "[1/2] online dualpath aps=0.1 ..." in proc.stderr
    assert "capacity (agents/s)" in proc.stdout


def test_plain_progress_heartbeat_while_nothing_advances() -> None:
    con = Console(file=io.StringIO(), force_terminal=False)
    with Progress("waiting for the cluster", total=3, console=con, interval_s=0.05) as bar:
        assert bar.plain
        seen = threading.Event()
        for _ in range(200):  # wait (not a timing assertion) for two heartbeat lines
            if con.file.getvalue().count("waiting for the cluster") >= 3:
                seen.set()
                break
            seen.wait(0.05)
        assert seen.is_set(), con.file.getvalue()
        bar.advance(description="step two")
    text = con.file.getvalue()
    assert text.splitlines()[0].startswith("[0/3] waiting for the cluster ... ")
    assert "[1/3] step two ... " in text and text.rstrip().endswith("elapsed, done")


def test_plain_progress_reports_a_failure_and_counts_without_total() -> None:
    con = Console(file=io.StringIO(), force_terminal=False)
    with pytest.raises(ValueError):
        with Progress("demo", console=con, interval_s=0) as bar:
            bar.update("demo: running basic")
            raise ValueError("boom")
    lines = con.file.getvalue().splitlines()
    assert lines[1].startswith("demo: running basic ... ") and "[" not in lines[1]
    assert lines[-1].endswith("stopped (ValueError)")


def test_terminal_gets_the_rich_bar_not_lines() -> None:
    con = Console(file=io.StringIO(), force_terminal=True, width=80)
    with Progress("simulating", total=2, console=con) as bar:
        assert not bar.plain
        bar.advance()
        bar.advance()
    assert "elapsed, done" not in con.file.getvalue()

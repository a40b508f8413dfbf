"""``dualpath bench`` (registered on a fresh app: the lead adds dualpath.cli.bench to the CLI)."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from dualpath.cli.bench import register


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:  # a group, so "bench" is a subcommand as in the real CLI
        pass

    register(app)
    return app


def test_bench_json_and_outputs(fake_server, tmp_path) -> None:
    url, fake = fake_server
    result = CliRunner().invoke(_app(), [
        "bench", "--url", url, "--agents", "2", "--maxlen", "8k", "--max-turns", "2", "--seed", "1",
        "--ttft-slo", "30", "--tpot-slo-ms", "5000", "--json", "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["num_ok"] == 4 and summary["slo"]["attainment"] == 1.0
    assert summary["mode"] == "offline" and summary["model"] == "tiny"
    assert (tmp_path / "o" / "latency_cdf.png").stat().st_size > 1000
    rows = (tmp_path / "o" / "requests.jsonl").read_text().splitlines()
    assert len(rows) == 4 and json.loads(rows[0])["ttft_s"] > 0
    assert json.loads((tmp_path / "o" / "bench.json").read_text())["num_requests"] == 4


def test_bench_table_output_online(fake_server) -> None:
    url, _ = fake_server
    result = CliRunner().invoke(_app(), ["bench", "--url", url, "--agents", "3", "--aps", "50",
                                         "--maxlen", "8k", "--max-turns", "1"])
    assert result.exit_code == 0, result.output
    assert "online" in result.stdout and "ttft_s" in result.stdout and "jct_s" in result.stdout


def test_bench_unreachable_url_is_a_clear_error() -> None:
    result = CliRunner().invoke(_app(), ["bench", "--url", "http://127.0.0.1:9", "--agents", "1"])
    assert result.exit_code != 0
    assert "cannot reach the server" in str(result.exception)

"""``dualpath bench`` (registered on a fresh app, as the real CLI does)."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from dualpath.cli.bench import register

# vllm bench serve's result keys (benchmarks/serve.py) that every result here carries
VLLM_KEYS = (
    "date",
    "backend",
    "label",
    "model_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std", "p99")),
)
AGENT_KEYS = (
    "mean_ttst_ms",
    "median_ttst_ms",
    "p99_ttst_ms",
    "mean_jct_ms",
    "p99_jct_ms",
    "num_agents",
    "agents_completed",
    "agent_throughput",
    "cache_hit_rate",
    "failure_reasons",
    "slo_attainment",
)


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:  # a group, so "bench" is a subcommand as in the real CLI
        pass

    register(app)
    return app


def test_bench_saves_a_vllm_style_result(fake_server, tmp_path) -> None:
    url, fake = fake_server
    result = CliRunner().invoke(
        _app(),
        [
            "bench",
            "--base-url",
            url,
            "--agents",
            "2",
            "--maxlen",
            "8k",
            "--max-turns",
            "2",
            "--seed",
            "1",
            "--ttft-slo",
            "30",
            "--tpot-slo-ms",
            "5000",
            "--metric-percentiles",
            "50,99",
            "--save-result",
            "--save-detailed",
            "--result-dir",
            str(tmp_path / "o"),
            "--result-filename",
            "r.json",
        ],
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    for line in (
        "============ Serving Benchmark Result ============",
        "Successful requests:",
        "Benchmark duration (s):",
        "Total input tokens:",
        "Request throughput (req/s):",
        "Output token throughput (tok/s):",
        "Mean TTFT (ms):",
        "Median TTFT (ms):",
        "P99 TTFT (ms):",
        "P50 TPOT (ms):",
        "Mean ITL (ms):",
        "Mean E2EL (ms):",
        "Mean TTST (ms):",
        "Agents completed:",
        "Mean JCT (ms):",
        "Server cache hit rate:",
    ):
        assert line in out, line
    saved = json.loads((tmp_path / "o" / "r.json").read_text())
    for key in (*VLLM_KEYS, *AGENT_KEYS, "p50_ttft_ms"):
        assert key in saved, key
    assert saved["completed"] == 4 and saved["failed"] == 0 and saved["model_id"] == "tiny"
    assert saved["request_rate"] == "inf" and len(saved["ttfts"]) == 4
    assert (tmp_path / "o" / "r_cdf.png").stat().st_size > 1000


def test_default_result_filename_is_vllms(fake_server, tmp_path, monkeypatch) -> None:
    url, _ = fake_server
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        _app(),
        [
            "bench",
            "--url",
            url,
            "--dataset-name",
            "random",
            "--num-prompts",
            "3",
            "--input-len",
            "5",
            "--output-len",
            "2",
            "--request-rate",
            "50",
            "--max-concurrency",
            "2",
            "--save-result",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["completed"] == 3 and data["request_rate"] == 50.0 and data["max_concurrency"] == 2
    names = [p.name for p in tmp_path.glob("*.json")]
    assert names == [f"dualpath-50.0qps-concurrency2-tiny-{data['date']}.json"]


def test_failed_requests_exit_nonzero_with_reasons(fake_server) -> None:
    url, fake = fake_server
    fake.token_delay_s = 0.5
    args = [
        "bench",
        "--url",
        url,
        "--agents",
        "2",
        "--maxlen",
        "64",
        "--max-turns",
        "1",
        "--output-len",
        "4",
        "--request-timeout",
        "0.05",
    ]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 1, result.output
    assert "Failed requests:                         2" in result.stdout
    assert "     2 x request timeout: no complete answer within 0.05 s" in result.stdout
    assert "error: 2 of 2 requests failed" in result.stderr
    assert result.output.index("error: 2 of 2 requests failed") < result.output.index("Failed requests")
    allowed = CliRunner().invoke(_app(), [*args, "--allow-failures"])
    assert allowed.exit_code == 0, allowed.output


def test_bench_table_output_online(fake_server) -> None:
    url, _ = fake_server
    result = CliRunner().invoke(
        _app(), ["bench", "--url", url, "--agents", "3", "--aps", "50", "--maxlen", "300", "--max-turns", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "Request rate configured (RPS):           50.00" in result.stdout
    assert "Agents completed:                        3/3" in result.stdout


def test_bench_unreachable_url_is_a_clear_error() -> None:
    result = CliRunner().invoke(_app(), ["bench", "--url", "http://127.0.0.1:9", "--agents", "1"])
    assert result.exit_code != 0
    assert "cannot reach the server" in str(result.exception)

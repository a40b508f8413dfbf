"""``dualpath bench`` against a real local cluster (tiny random model): the saved result parses
with vLLM's keys, every request succeeds, and the server's store hits show up as the hit rate."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from dualpath.cli.bench import register

VLLM_KEYS = (
    "date",
    "model_id",
    "num_prompts",
    "request_rate",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std", "p99")),
)


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        pass

    register(app)
    return app


def test_bench_against_a_real_cluster(real_server, tmp_path) -> None:
    result = CliRunner().invoke(
        _app(),
        [
            "bench",
            "--base-url",
            real_server,
            "--agents",
            "2",
            "--maxlen",
            "512",
            "--max-turns",
            "3",
            "--output-len",
            "4",
            "--max-concurrency",
            "2",
            "--request-timeout",
            "120",
            "--save-result",
            "--result-dir",
            str(tmp_path),
            "--result-filename",
            "real.json",
        ],
    )
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "real.json").read_text())
    for key in (*VLLM_KEYS, "mean_ttst_ms", "mean_jct_ms", "agent_throughput", "cache_hit_rate"):
        assert key in saved, key
    assert saved["failed"] == 0 and saved["completed"] == saved["num_prompts"] >= 4
    assert saved["agents_completed"] == 2 and saved["total_output_tokens"] == 4 * saved["completed"]
    assert saved["model_id"] == "tiny" and saved["max_concurrency"] == 2
    assert saved["cache_counters"] == "dualpath" and 0 < saved["cache_hit_rate"] < 1
    assert saved["mean_ttft_ms"] > 0 and saved["p99_e2el_ms"] >= saved["median_e2el_ms"]
    assert "Server cache hit rate:" in result.stdout and "n/a" not in result.stdout

"""`dualpath workload stats|generate` through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dualpath.cli import app
from dualpath.core.errors import ConfigError
from dualpath.workload import TABLE2, load_jsonl

runner = CliRunner()


def _json(*args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_stats_json_matches_table2() -> None:
    out = _json("workload", "stats", "--maxlen", "64k", "--num", "500")
    assert out["maxlen"] == 65536 and out["num_trajectories"] == 500 and out["seed"] == 0
    assert out["targets"]["turns"] == TABLE2[65536]["turns"]
    for col, err in out["rel_error"].items():
        assert abs(err) < 0.05, col
        assert out[col] == pytest.approx(out["targets"][col] * (1 + err))


def test_stats_table_shows_paper_targets() -> None:
    result = runner.invoke(app, ["workload", "stats", "--maxlen", "32k", "--num", "100"])
    assert result.exit_code == 0, result.output
    assert "paper (Table 2)" in result.stdout and "28,639" in result.stdout


def test_stats_of_a_trace() -> None:
    out = _json("workload", "stats", "--trace", "azure-conv")
    assert out["source"] == "azure-conv" and out["turns"] == 1.0 and out["targets"] is None


def test_generate_writes_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    out = _json(
        "workload",
        "generate",
        "--maxlen",
        "48k",
        "--num",
        "8",
        "--seed",
        "2",
        "--agents",
        "12",
        "--out",
        str(path),
    )
    trajs = load_jsonl(path)
    assert out["num_trajectories"] == len(trajs) == 12
    assert sum(t.parent_id is not None for t in trajs) == 4
    assert out["total_turns"] == sum(t.num_turns for t in trajs)


def test_bad_maxlen_is_a_config_error() -> None:
    result = runner.invoke(app, ["workload", "stats", "--maxlen", "12", "--json"])
    assert result.exit_code != 0
    assert isinstance(result.exception, ConfigError)

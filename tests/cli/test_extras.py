"""Install extras: the base commands run with every serve library (and pyarrow) unimportable, and a
command whose extra is missing prints one ``error:`` line naming it and exits 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
SERVE_EXTRA = (
    "torch",
    "transformers",
    "tokenizers",
    "gguf",
    "safetensors",
    "fastapi",
    "uvicorn",
    "zmq",
    "prometheus_client",
    "isal",
)
# Runs the CLI with the named top-level modules unimportable, as in a base install.
BLOCKED_CLI = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None
sys.meta_path.insert(0, Block())
sys.argv = ["dualpath", *sys.argv[2:]]
from dualpath.cli import main
main()
"""


def _run(
    args: list[str], blocked: tuple[str, ...] = (*SERVE_EXTRA, "pyarrow", "pandas")
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-c", BLOCKED_CLI, ",".join(blocked), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "--help"],
        ["plan", "--help"],
        ["workload", "--help"],
        ["bench", "--help"],
        ["serve", "--help"],
        ["check", "--help"],
        ["models", "--json"],
    ],
)
def test_help_and_tables_without_the_extras(args: list[str]) -> None:
    result = _run(args)
    assert result.returncode == 0, result.stderr


def test_base_commands_run_without_the_extras() -> None:
    sim = _run(["simulate", "--agents", "8", "--maxlen", "32k", "--system", "dualpath", "--json"])
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["systems"]["dualpath"]["jct_s"] > 0
    plan = _run(["plan", "pd-range", "--json"])
    assert plan.returncode == 0, plan.stderr
    stats = _run(["workload", "stats", "--num", "20", "--json"])
    assert stats.returncode == 0, stats.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["serve"],
        ["serve", "--kv-dir", "/nonexistent"],
        ["demo", "--tiny"],
        ["engine", "--role", "prefill"],
        ["check", "--json"],
    ],
)
def test_serve_commands_name_the_extra(args: list[str]) -> None:
    result = _run(args, blocked=("torch", "fastapi"))
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert "pip install 'dualpath[serve]'" in lines[0] and "torch, fastapi" in lines[0]
    assert f"`dualpath {args[0]}`" in lines[0]


def test_calibrated_without_pyarrow_runs_the_bundled_tables_and_says_so() -> None:
    result = _run(
        [
            "simulate",
            "--agents",
            "4",
            "--maxlen",
            "32k",
            "--system",
            "dualpath",
            "--cost-model",
            "calibrated",
            "--json",
        ],
        blocked=("pyarrow",),
    )
    assert result.returncode == 0, result.stderr
    dualpath = json.loads(result.stdout)["systems"]["dualpath"]
    assert dualpath["jct_s"] > 0  # the data folder (tests/data) has parquet, pyarrow cannot read it
    assert dualpath["cost_model"].startswith("calibrated (bundled h100_sxm.npz (pyarrow not installed")


def test_calibrated_with_pyarrow_runs_on_the_shipped_tables() -> None:
    result = _run(
        [
            "simulate",
            "--agents",
            "4",
            "--maxlen",
            "32k",
            "--system",
            "dualpath",
            "--cost-model",
            "calibrated",
            "--json",
        ],
        blocked=SERVE_EXTRA,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["systems"]["dualpath"]["jct_s"] > 0

"""`dualpath models` / `dualpath hardware`."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dualpath.cli import app
from dualpath.spec.models import MODELS

runner = CliRunner()


def test_models_json() -> None:
    result = runner.invoke(app, ["models", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["models"]
    assert {r["name"] for r in rows} == set(MODELS)
    ds = next(r for r in rows if r["name"] == "deepseek-v3.2")
    assert ds["kv_bytes_per_token"] == 40016 and ds["sparse_top_k"] == 2048


def test_hardware_json() -> None:
    result = runner.invoke(app, ["hardware", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    names = {g["name"] for g in out["gpus"]}
    assert {"a100", "h100", "h200", "b200"} <= names
    assert {"a100-40gb", "l40s", "l4", "a10g", "t4", "v100", "m60"} <= names  # planner GPU catalogue
    assert any(n["name"] == "hopper-8x400" for n in out["nodes"])
    assert any(c["name"] == "ds660b-48p96d" and c["num_gpus"] == 1152 for c in out["clusters"])


def test_tables_render() -> None:
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0 and "deepseek-v3.2" in result.stdout
    result = runner.invoke(app, ["hardware"])
    assert result.exit_code == 0 and "hopper-8x400" in result.stdout

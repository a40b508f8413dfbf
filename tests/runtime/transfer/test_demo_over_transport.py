"""``dualpath demo --tiny --transport X`` on each one-sided engine (slow: starts a served cluster;
the engine processes move their Layer Blocks over X)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["mooncake", "nixl"])
def test_demo_tiny_runs_over_the_engine(engine: str) -> None:
    from dualpath.runtime.transfer.factory import missing

    if (why := missing(engine)) is not None:
        pytest.skip(f"transport {engine} not importable here: {why}")
    exe = str(Path(sys.executable).parent / "dualpath")
    args = [
        "demo",
        "--tiny",
        "--transport",
        engine,
        "--systems",
        "basic,dualpath",
        "--agents",
        "2",
        "--turns",
        "2",
    ]
    out = subprocess.run([exe, *args, "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout)
    for system in ("basic", "dualpath"):
        got = data["systems"][system]
        assert got["errors"] == [], got["errors"]
        assert got["bytes_by_path"]["pd-transfer"] > 0  # PE -> DE KV crossed the engine
    assert data["ratios"]["dualpath_speedup_over_basic"] > 0

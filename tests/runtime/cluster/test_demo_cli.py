"""``dualpath demo --tiny --json`` end to end (slow: starts a cluster and runs three systems)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_tiny_json() -> None:
    exe = str(Path(sys.executable).parent / "dualpath")
    out = subprocess.run(
        [exe, "demo", "--tiny", "--agents", "3", "--turns", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout)
    assert set(data["systems"]) == {"basic", "dualpath", "oracle"}
    basic = data["systems"]["basic"]
    assert basic["errors"] == [] and basic["bytes_by_path"]["de-read"] == 0
    assert basic["snic_read_bytes"]["node0"] > 0
    assert data["ratios"]["dualpath_speedup_over_basic"] > 0
    assert data["comparison"]["same_work"] and data["comparison"]["problems"] == []
    assert all(v >= 0 for r in data["systems"].values() for v in r["bytes_by_path"].values())

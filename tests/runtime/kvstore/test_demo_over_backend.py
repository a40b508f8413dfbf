"""``dualpath demo --tiny --kv-backend X`` on each optional storage backend (slow: starts a served
cluster whose engines persist and reload their KV blocks on X; mooncake: the cluster starts its
own master and holder)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["nixl-posix", "mooncake"])
def test_demo_tiny_runs_on_the_backend(backend: str) -> None:
    from dualpath.runtime.kvstore.backends import missing

    if (why := missing(backend)) is not None:
        pytest.skip(f"kv backend {backend} not importable here: {why}")
    exe = str(Path(sys.executable).parent / "dualpath")
    args = ["demo", "--tiny", "--kv-backend", backend, "--systems", "basic,dualpath", "--agents", "2",
            "--turns", "3"]  # fmt: skip
    out = subprocess.run([exe, *args, "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout)
    assert data["config"]["kv_backend"] == backend
    for system in ("basic", "dualpath"):
        got = data["systems"][system]
        assert got["errors"] == [], got["errors"]
        assert got["hit_rate"] > 0  # later turns found earlier turns' blocks on the backend
        by_path = got["bytes_by_path"]
        assert by_path["persist"] > 0 and by_path["pe-read"] + by_path["de-read"] > 0
    assert data["comparison"]["same_work"]

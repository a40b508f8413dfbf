"""`dualpath serve|engine --kv-file-mode / --kv-capacity-gb` (and serve's scheduler choices): bad
values exit 2 with one error line naming the value, before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "args,named",
    [
        (["serve", "--kv-file-mode", "0644"], "kv_file_mode='0644'"),
        (["serve", "--kv-file-mode", "rw"], "kv_file_mode='rw'"),
        (["serve", "--kv-capacity-gb", "-2"], "kv_capacity_gb=-2.0"),
        (["serve", "--pe-scope", "cluster"], "pe scope='cluster'"),
        (["serve", "--read-tie", "both"], "read tie='both'"),
        (["serve", "--pe-tie", "random"], "pe tie='random'"),
        (
            [
                "engine",
                "--role",
                "decode",
                "--scheduler",
                "127.0.0.1:9",
                "--node-id",
                "0",
                "--kv-file-mode",
                "0700",
            ],
            "kv_file_mode='0700'",
        ),
    ],
)
def test_bad_kv_options_exit_2_naming_the_value(tmp_path: Path, args: list[str], named: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from dualpath.cli import main; main()",
            *args,
            "--kv-dir",
            str(tmp_path / "kv"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], done.stderr
    assert not (tmp_path / "kv").exists()  # nothing was started or created

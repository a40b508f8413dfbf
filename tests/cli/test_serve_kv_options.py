"""`dualpath serve|engine --kv-file-mode / --kv-capacity-gb / --kv-backend` (and serve's scheduler
choices; demo's and check's --kv-backend): bad values exit 2 with one error line naming the value, before anything starts."""

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
        (["serve", "--kv-backend", "s3"], "kv_backend='s3'"),
        (["scheduler", "--kv-backend", "s3"], "kv_backend='s3'"),
        (
            ["serve", "--kv-backend", "mooncake", "--mooncake-master", "127.0.0.1:9"],
            "kv_mooncake_master='127.0.0.1:9'",
        ),
        (
            [
                "engine",
                "--role",
                "decode",
                "--scheduler",
                "127.0.0.1:9",
                "--node-id",
                "0",
                "--kv-backend",
                "mooncake",
            ],
            "--kv-backend mooncake needs --mooncake-master",
        ),
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


@pytest.mark.parametrize(
    "args,named",
    [(["demo", "--tiny", "--kv-backend", "lustre"], "kv_backend='lustre'"),
     (["check", "--kv-backend", "lustre"], "kv backend='lustre'")],
)  # fmt: skip
def test_demo_and_check_refuse_an_unknown_kv_backend(args: list[str], named: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from dualpath.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2 and len(lines) == 1 and named in lines[0], done.stderr

"""Argument and model errors of ``dualpath serve`` are found before any engine starts."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dualpath.core.errors import ConfigError
from dualpath.runtime.cluster.config import ClusterConfig
from dualpath.runtime.cluster.local import LocalCluster
from dualpath.runtime.server.run import preflight


def test_serve_with_an_unknown_model_fails_at_once_with_one_error_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dualpath.cli",
            "serve",
            "--model",
            "nosuchmodel",
            "--kv-dir",
            str(tmp_path / "kv"),
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: model='nosuchmodel'"), proc.stderr
    assert not (tmp_path / "kv").exists()  # nothing was started


def test_local_cluster_refuses_an_unknown_model_before_spawning(tmp_path: Path) -> None:
    cluster = LocalCluster(ClusterConfig(kv_dir=str(tmp_path / "kv"), model="nosuchmodel"))
    with pytest.raises(ConfigError, match="nosuchmodel"):
        cluster.start()
    assert cluster.supervisor_proc is None and not cluster.pids()  # nothing was started
    cluster.stop()


def test_preflight_names_a_busy_port_and_bad_settings() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port={port}"):
            preflight("127.0.0.1", port, "tiny")
    with pytest.raises(ConfigError, match="port=70000"):
        preflight("127.0.0.1", 70000, "tiny")
    assert preflight("127.0.0.1", 0, "tiny").encode("hi")  # the tokenizer, loaded


def _serve(kv_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dualpath.cli",
            "serve",
            "--model",
            "tiny",
            "--kv-dir",
            str(kv_dir),
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_serve_refuses_an_unusable_kv_dir_before_any_engine_starts(tmp_path: Path) -> None:
    """Issue 30 item 9: before, a read-only KV directory was refused only after the engines had
    loaded (28 s on SmolLM2), with a traceback tail. Now: one ``error:`` line, exit 2, nothing
    started. (Root ignores permission bits, so the unusable directory here is a regular file.)"""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    proc = _serve(blocker)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: kv_dir="), proc.stderr
    assert "not a writable directory" in lines[0] and "Traceback" not in proc.stderr


def test_serve_refuses_a_read_only_kv_dir(tmp_path: Path, mount_tmpfs) -> None:  # type: ignore[no-untyped-def]
    ro = mount_tmpfs("1m")
    done = subprocess.run(["mount", "-o", "remount,ro", str(ro)], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot remount read-only: {done.stderr.strip()}")
    proc = _serve(ro)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Read-only file system" in lines[0], proc.stderr

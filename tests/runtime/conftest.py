"""On a failing test, the logs of every local cluster still running are added to its report;
fixtures for full-disk tests: ``mount_tmpfs(size)`` (a small tmpfs, unmounted after the test;
the test skips with the reason when mounting is not allowed) and ``fill_disk(path)``."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    if not rep.failed:
        return
    from dualpath.runtime.cluster.local import LocalCluster

    for c in LocalCluster.running():
        rep.sections.append((f"local cluster {c.cluster_id} logs", c.log_tails()))


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``mount(size)`` -> a fresh tmpfs of ``size`` (e.g. "4m") under ``tmp_path``."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        path = tmp_path / f"tmpfs{len(mounted)}"
        path.mkdir()
        try:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"cannot mount a tmpfs here: {exc}")
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def _fill_disk(path: Path) -> None:
    """Write zeros to ``path`` until its file system is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


@pytest.fixture
def fill_disk() -> Callable[[Path], None]:
    return _fill_disk

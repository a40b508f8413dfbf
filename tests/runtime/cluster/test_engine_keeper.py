"""``dualpath engine --restart-on-exit`` (runtime/cluster/engine_keeper.py): the real command, its
engine a child process. The netns tests (tests/runtime/netns) restart one inside a cluster; these
check the keeper alone: restart after kill -9 as the next generation, SIGTERM stops both, and a
crash loop gives up after the restart burst."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from dualpath.runtime.cluster.local import tiny_model_dir


def _keeper(tmp_path: Path, model: str, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / "keeper.log"
    cmd = [sys.executable, "-m", "dualpath.cli", "engine", "--role", "decode", "--scheduler", "127.0.0.1:9",
           "--kv-dir", str(tmp_path / "kv"), "--node-id", "0", "--model", model, "--kv-cache-memory", "16MiB",
           "--restart-on-exit", *extra]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return proc, log


def _starts(log: Path) -> list[tuple[int, int]]:
    """(pid, generation) of each engine the keeper started."""
    text = log.read_text(errors="replace")
    return [(int(p), int(g)) for p, g in re.findall(r"engine started \(pid (\d+), generation (\d+)\)", text)]


def _wait(what: str, check, timeout_s: float = 90.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return got


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # (a zombie: exited)


def test_a_killed_engine_is_started_again_and_sigterm_stops_both(tmp_path: Path) -> None:
    """The engine waits for a scheduler nobody runs (an engine outlives its scheduler); kill -9 of
    it: started again, the next generation, after the first backoff; SIGTERM of the keeper: the
    engine stops and the keeper exits 0, no restart."""
    proc, log = _keeper(tmp_path, str(tiny_model_dir(tmp_path)))
    try:
        (pid, gen), *_ = _wait("the engine", lambda: _starts(log))
        assert gen == 0
        time.sleep(1.0)
        assert not _gone(pid) and proc.poll() is None
        os.kill(pid, signal.SIGKILL)
        (pid2, gen2) = _wait("the restart", lambda: _starts(log)[1:])[0]
        assert pid2 != pid and gen2 == 1
        assert f"engine (pid {pid}) killed by SIGKILL; restarting in 0.5 s" in log.read_text()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
        assert _wait("the engine to stop", lambda: _gone(pid2), 30)
        assert len(_starts(log)) == 2 and "stopped" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_a_crash_loop_gives_up_after_the_restart_burst(tmp_path: Path) -> None:
    """An engine that cannot start (no such model) exits at once, each time: restarted with
    doubling backoff (0.5 s, 1 s), then, the burst (2) spent, not again; the keeper exits 1."""
    proc, log = _keeper(tmp_path, str(tmp_path / "no-such-model"), "--restart-burst", "2")
    try:
        assert proc.wait(180) == 1, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    text = log.read_text()
    assert [g for _, g in _starts(log)] == [0, 1, 2], text
    assert "exited with code 1; restarting in 0.5 s" in text and "restarting in 1 s" in text, text
    assert "restarted 2 times within 60 s (the restart burst): not restarted again" in text, text

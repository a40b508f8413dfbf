from __future__ import annotations

import asyncio
import socket

import pytest

from dualpath.runtime.cluster.api import ClusterUnavailableError, SamplingParams
from dualpath.runtime.cluster.client import ClusterClient


def _dead_address() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"tcp://127.0.0.1:{port}"


def test_generate_without_a_scheduler_fails_instead_of_hanging() -> None:
    async def main() -> None:
        async with ClusterClient(_dead_address(), query_timeout_s=0.3, liveness_s=0.2) as client:
            with pytest.raises(ClusterUnavailableError, match="did not answer"):
                async for _ in client.generate([1, 2, 3], SamplingParams(max_tokens=2)):
                    pass
            with pytest.raises(ClusterUnavailableError):
                await client.health()

    asyncio.run(asyncio.wait_for(main(), 10))

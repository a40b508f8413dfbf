"""One real local cluster (tiny random model, 1 PE + 1 DE, CURVE-authenticated planes as
``dualpath serve`` runs it) behind the real HTTP API, shared by the fault tests of this package;
helpers to talk to its ports as a forger would (an insider holding the key, or not)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import zmq

from dualpath.runtime.cluster.config import ClusterConfig, EngineConfig
from dualpath.runtime.cluster.local import LocalCluster
from dualpath.runtime.server import BackgroundServer, CharTokenizer, ServerConfig, create_app


@dataclass
class Rig:
    cluster: LocalCluster
    url: str

    def data_addr(self, role: str) -> str:
        health = self.cluster.health()
        assert health is not None
        return next(e.data_addr for e in health.engines if e.role == role and e.alive)

    def sock(self, kind: int, addr: str, *, keyed: bool = True) -> zmq.Socket:
        """A socket connected to ``addr``, presenting the cluster key unless ``keyed`` is False."""
        s = zmq.Context.instance().socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        if keyed:
            assert self.cluster.keys is not None
            self.cluster.keys.client(s)
        s.connect(addr)
        return s

    def chat(self, content: str = "hello", **extra: object) -> httpx.Response:
        body = {
            "model": "tiny",
            "max_tokens": 4,
            "temperature": 0,
            "messages": [{"role": "user", "content": content}],
            **extra,
        }
        return httpx.post(self.url + "/v1/chat/completions", json=body, timeout=120)

    def assert_serving(self) -> None:
        """A normal request succeeds and every engine is alive, none ever declared dead."""
        r = self.chat()
        assert r.status_code == 200, r.text
        assert (
            r.json()["usage"]["completion_tokens"] == 4 or r.json()["choices"][0]["finish_reason"] == "stop"
        )
        health = self.cluster.health()
        assert health is not None and health.ok and all(e.alive for e in health.engines)
        assert self.metric("dualpath_engine_deaths_total") == 0

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample on /metrics (0 if absent)."""
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in httpx.get(self.url + "/metrics", timeout=30).text.splitlines():
            head, _, value = line.rpartition(" ")
            if head == (f"{name}{{{want}}}" if want else name):
                return float(value)
        return 0.0

    def wait_metric(self, name: str, above: float, **labels: str) -> float:
        """Poll /metrics until the sample exceeds ``above`` (engine counts come with heartbeats)."""
        deadline = time.monotonic() + 30
        while (v := self.metric(name, **labels)) <= above and time.monotonic() < deadline:
            time.sleep(0.2)
        return v


@pytest.fixture(scope="package")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    cfg = ClusterConfig(
        kv_dir=str(tmp_path_factory.mktemp("kv")),
        model="tiny",
        num_prefill_engines=1,
        num_decode_engines=1,
        engine=EngineConfig(heartbeat_s=0.1),
    )
    with LocalCluster(cfg, auth=True) as cluster:
        app = create_app(
            cluster.address,
            CharTokenizer(vocab_size=512),
            ServerConfig(model_name="tiny", cluster_key_file=str(cluster.key_file)),
        )
        with BackgroundServer(app) as srv:
            yield Rig(cluster, srv.url)

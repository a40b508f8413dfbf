"""Cluster counters summed from engine heartbeats never go backwards (issue 31: a demo run across
a decode engine's restart printed ``persist (MB) -32.44``). A real supervised 1P2D cluster (tiny
model): requests persist KV through both decode engines, one is killed with SIGKILL and restarted;
every byte and store counter of the cluster is at least what it was before the kill. (Before: the
scheduler summed the engines' latest heartbeats, so the killed engine's counts vanished.)"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import zmq

from dualpath.runtime.cluster.config import ClusterConfig, EngineConfig, SchedulerServiceConfig
from dualpath.runtime.cluster.local import LocalCluster
from dualpath.runtime.cluster.messages import Query, decode, encode
from dualpath.runtime.server import BackgroundServer, CharTokenizer, ServerConfig, create_app


def _metrics(cluster: LocalCluster):  # type: ignore[no-untyped-def]
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(cluster.address)
    s.send_multipart([b"", encode(Query(query_id=3, what="metrics"))])
    assert s.poll(30_000)
    reply = decode(s.recv_multipart()[-1])
    s.close(0)
    return reply.metrics


def _counters(cluster: LocalCluster) -> dict[str, int]:
    m = _metrics(cluster)
    out = {f"path/{k}": v for k, v in m.bytes_by_path.items()}
    out |= {f"nic/{k}": v for k, v in m.bytes_by_nic.items()}
    return out | {f"store/{k}": v for k, v in m.store_counts.items()}


def test_counters_survive_a_decode_engine_restart(tmp_path: Path) -> None:
    cfg = ClusterConfig(
        kv_dir=str(tmp_path / "kv"),
        model="tiny",
        num_prefill_engines=1,
        num_decode_engines=2,
        engine=EngineConfig(heartbeat_s=0.1),
        scheduler=SchedulerServiceConfig(engine_timeout_s=3.0),
    )
    with LocalCluster(cfg) as cluster:
        app = create_app(cluster.address, CharTokenizer(vocab_size=512), ServerConfig(model_name="tiny"))
        with BackgroundServer(app) as srv:
            for i in range(8):  # long prompts: full blocks persisted on both decode engines
                body = {"model": "tiny", "prompt": [5 + i] * 300, "max_tokens": 8, "ignore_eos": True}
                assert httpx.post(srv.url + "/v1/completions", json=body, timeout=120).status_code == 200
            time.sleep(1.0)  # (the engines' counters come with heartbeats)
            before = _counters(cluster)
            assert before.get("path/persist", 0) > 0, before
            # the decode engine that persisted most (one engine per node: engine i on node i)
            de = max(
                (
                    int(n.removeprefix("engine"))
                    for n in cluster.pids()
                    if n.startswith("engine") and n != "engine0"
                ),
                key=lambda e: before.get(f"nic/node{e}/snic-tx", 0),
            )
            assert before.get(f"nic/node{de}/snic-tx", 0) > 0, before
            cluster.signal(f"engine{de}", 9)
            deadline = time.monotonic() + 90
            while not ((h := cluster.health()) and h.ok and all(e.alive for e in h.engines) and h.restarts):
                assert time.monotonic() < deadline, "the decode engine did not come back"
                time.sleep(0.3)
            time.sleep(1.0)
            after = _counters(cluster)
    lower = {k: (before[k], after.get(k, 0)) for k in before if after.get(k, 0) < before[k]}
    assert not lower, lower

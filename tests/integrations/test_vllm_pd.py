"""vLLM P/D pieces without vLLM: the router's read side is the policy's, the DE read path (a node
agent reads the store and forwards layer by layer over the ZeroMQ transport) delivers intact bytes
and cuts the good prefix at a corrupt block, async loads are planned once, and the agent's
``/metrics`` counts the bytes of each path."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from dualpath.core.errors import ConfigError
from dualpath.integrations.vllm.agent import Agent, make_app
from dualpath.integrations.vllm.forward import ForwardInbox, StepLoads
from dualpath.integrations.vllm.layout import model_layout
from dualpath.integrations.vllm.plan import BlockSizes, LoadSpec, RequestTracker
from dualpath.integrations.vllm.router import Instance, Router
from dualpath.integrations.vllm.settings import ConnectorSettings, read_source
from dualpath.runtime.kvstore import BlockLayout, BlockStore
from dualpath.runtime.kvstore.files import block_path
from dualpath.runtime.kvstore.layout import chain_hashes
from dualpath.runtime.server.run import BackgroundServer

from .conftest import filled_store

LAYOUT = BlockLayout(num_layers=3, kv_bytes_per_token_layer=8, block_size=4)
P = Instance(role="prefill", node_id=0, url="http://p", agent_url="http://a0")
D1 = Instance(role="decode", node_id=1, url="http://d1", agent_url="http://a1")
D2 = Instance(role="decode", node_id=2, url="http://d2", agent_url="http://a2")


def _store(tmp_path: Path, tokens: list[int]) -> tuple[BlockStore, list[str], list[np.ndarray]]:
    return filled_store(tmp_path, tokens, LAYOUT, seed=1)


def _spec(hashes: list[str], agent_url: str = "") -> LoadSpec:
    return LoadSpec(req_id="r", hashes=tuple(hashes), first_block=0, start_token=0,
                    end_token=4 * len(hashes), vllm_block_ids=tuple(range(len(hashes))),
                    agent_url=agent_url)  # fmt: skip


def test_router_reads_where_the_policy_says(tmp_path: Path) -> None:
    tokens = list(range(40))
    store, _, _ = _store(tmp_path, tokens)
    basic = Router([P, D1, D2], store, policy="basic", read_bytes_per_s=1e6)
    for i in range(4):
        assert basic.submit(f"b{i}", tokens + [99 + i], 4) == 40
    routes = basic.tick(0.0)
    assert len(routes) == 4 and {r.read_side for r in routes} == {"pe"}
    assert {r.decode.url for r in routes} == {"http://d1", "http://d2"}  # round robin
    assert basic.read_queues()[0] == 160
    dual = Router([P, D1, D2], store, policy="dualpath", read_bytes_per_s=1e6)
    for i in range(6):
        dual.submit(f"r{i}", tokens + [99 + i], 4)
    routes = dual.tick(0.0)
    sides = [r.read_side for r in routes]
    assert len(routes) == 6 and "de" in sides and "pe" in sides  # the shorter queue, each time
    de = next(r for r in routes if r.read_side == "de")
    assert de.kv_transfer_params() == {"dualpath": {"read_side": "de", "agent_url": de.decode.agent_url}}
    assert de.kv_transfer_params(snic=False)["dualpath"]["snic"] is False
    for r in routes:
        dual.prefill_done(r.request_id)
        dual.finished(r.request_id)
    assert set(dual.read_queues().values()) == {0}
    with pytest.raises(ConfigError, match="split"):
        dual.set_policy("dualpath-split")


def test_read_source_from_kv_transfer_params() -> None:
    assert read_source("r", None) == ("", True)
    assert read_source("r", {"dualpath": {"read_side": "pe", "snic": False}}) == ("", False)
    assert read_source("r", {"dualpath": {"read_side": "de", "agent_url": "http://x:1"}}) == (
        "http://x:1",
        True,
    )
    assert read_source("r", {"dualpath": {"read_side": "sideways"}}) == ("", True)  # logged, read here
    with pytest.raises(ConfigError, match="load"):
        ConnectorSettings.from_extra({"store_dir": "/x", "load": "eager"}, vllm_block_size=4)


def test_async_loads_are_sent_once_without_the_request_scheduled() -> None:
    t = RequestTracker(BlockSizes(vllm_block_size=4, store_block_size=4))
    tokens = list(range(13))
    t.admit("r", lambda: tokens)
    t.set_hit("r", chain_hashes(tokens, 4)[:3])
    t.plan_load("r", [7, 8, 9, 10], 12, 12, "http://a", async_load=True)
    (load,) = t.take_async_loads()
    assert load.async_load and load.agent_url == "http://a" and load.end_token == 12
    assert t.take_async_loads() == []
    assert t.step_specs("r", 13)[0] is None  # scheduled later: no second load


def test_de_read_path_forwards_intact_layers_and_counts_bytes(tmp_path: Path) -> None:
    tokens = list(range(16))
    store, hashes, blocks = _store(tmp_path, tokens)
    (tmp_path / "node1-decode.json").write_text(json.dumps({"read_bytes": 5, "written_bytes": 7}))
    (tmp_path / "node1-prefill.json").write_text(json.dumps({"read_bytes": 3, "written_bytes": 1}))
    agent = Agent(store, node_id=1, limiter=None, counters_files=[str(tmp_path / "node1-*.json")])
    inbox = ForwardInbox(store, timeout_s=30.0)
    try:
        with BackgroundServer(make_app(agent)) as srv:
            job = StepLoads(store, [_spec(hashes[:2]), _spec(hashes, srv.url)], inbox=inbox)
            for layer in range(LAYOUT.num_layers):
                local, remote = job.wait(layer)
                assert len(local) == 2 and len(remote) == 4
                for j in range(4):
                    assert np.array_equal(remote[j], LAYOUT.layer_view(blocks[j], layer))
                job.release(layer)
            assert job.finish() == [2, 4]
            nbytes = LAYOUT.layer_block_bytes
            assert job.read_bytes == 2 * 3 * nbytes and job.forwarded_bytes == 4 * 3 * nbytes
            text = httpx.get(f"{srv.url}/metrics").text
            assert f"dualpath_vllm_de_read_bytes_total {float(4 * 3 * nbytes)}" in text
            assert f"dualpath_vllm_forwarded_bytes_total {float(4 * 3 * nbytes)}" in text
            assert "dualpath_vllm_pe_read_bytes_total 3.0" in text  # prefill connectors only
            assert (
                "dualpath_vllm_pd_kv_bytes_total 5.0" in text
                and "dualpath_vllm_saved_bytes_total 8.0" in text
            )

            path = block_path(store.root, hashes[2])  # damage block 2's last layer on disk
            data = bytearray(path.read_bytes())
            data[-3] ^= 0xFF
            path.write_bytes(bytes(data))
            job = StepLoads(store, [_spec(hashes, srv.url)], inbox=inbox)
            got = [len(job.wait(layer)[0]) for layer in range(LAYOUT.num_layers)]
            # (a layer waited for after the bad one was read is already cut to the good prefix)
            assert got[-1] == 2 and min(got) == 2 and job.finish() == [2]  # a miss from block 2 on
            assert httpx.post(f"{srv.url}/read", json={"key": "k", "hashes": [], "address": "x",
                                                       "endpoint": "e"}).status_code == 422  # fmt: skip
    finally:
        inbox.close()
        agent.close()


def test_an_unreachable_agent_is_a_miss(tmp_path: Path) -> None:
    store, hashes, _ = _store(tmp_path, list(range(8)))
    inbox = ForwardInbox(store, timeout_s=5.0)
    try:
        job = StepLoads(store, [_spec(hashes, "http://127.0.0.1:9")], inbox=inbox)
        assert len(job.wait(0)[0]) == 0 and job.finish() == [0]
    finally:
        inbox.close()


def test_model_layout_reads_the_hf_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 30, "num_attention_heads": 9,
                                                      "num_key_value_heads": 3, "hidden_size": 576}))  # fmt: skip
    lay = model_layout(tmp_path, 32)
    assert (lay.num_layers, lay.kv_bytes_per_token_layer, lay.block_size) == (30, 2 * 3 * 64 * 4, 32)
    with pytest.raises(ConfigError, match="config.json"):
        model_layout(tmp_path / "nope", 32)


def test_proxy_app_opens_and_closes_its_client_and_refuses_bad_bodies(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from dualpath.integrations.vllm.proxy import Proxy
    from dualpath.integrations.vllm.proxy import make_app as make_proxy_app

    store, _, _ = _store(tmp_path, list(range(8)))
    proxy = Proxy(Router([P, D1], store, policy="basic", read_bytes_per_s=1e6), model="m",
                  tokenize=lambda text: [ord(c) for c in text])  # fmt: skip
    assert proxy.client is None
    with TestClient(make_proxy_app(proxy)) as client:
        assert proxy.client is not None and not proxy.client.is_closed  # opened by the lifespan
        assert client.get("/health").json()["policy"] == "basic"
        assert client.post("/v1/completions", json=[1, 2]).status_code == 422
        assert client.post("/v1/completions", json={"prompt": "hi", "stream": True}).status_code == 422
        bad = client.post("/v1/completions", json={"prompt": ""})
        assert bad.status_code == 422 and "prompt" in bad.json()["detail"]
        assert client.post("/configure", json={"policy": "no-such-policy"}).status_code == 422
    assert proxy.client.is_closed  # closed on shutdown

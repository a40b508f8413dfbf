"""vLLM P/D pieces without vLLM: the router's read side is the policy's, the DE read path (a node
agent reads the store and forwards layer by layer over the ZeroMQ transport) delivers intact bytes
and cuts the good prefix at a corrupt block, async loads are planned once, and the agent's
``/metrics`` counts the bytes of each path."""

from __future__ import annotations

import json
import time
from dataclasses import replace
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


def test_a_split_read_is_carried_to_the_connector(tmp_path: Path) -> None:
    """Policy "dualpath-split": with both queues empty and equal rates the hit is cut in half at a
    whole block; the PE reads the prefix (``pe_read_len``), the decode node's agent the rest."""
    tokens = list(range(40))
    store, _, _ = _store(tmp_path, tokens)
    split = Router([P, D1], store, policy="dualpath-split", read_bytes_per_s=1e6)
    split.submit("s", tokens + [99], 4)
    (route,) = split.tick(0.0)
    assert route.read_side == "split" and route.pe_read_len == 20 and route.de_read_len == 20
    params = route.kv_transfer_params()
    assert params == {"dualpath": {"read_side": "split", "agent_url": "http://a1", "pe_read_len": 20}}
    assert read_source("s", params) == ("http://a1", True, 20)
    assert split.read_queues() == {0: 20, 1: 20}
    split.prefill_done("s")
    assert set(split.read_queues().values()) == {0}


def test_load_parts_cut_at_a_whole_store_block() -> None:
    spec = LoadSpec(req_id="r", hashes=tuple("abcd"), first_block=1, start_token=6, end_token=20,
                    vllm_block_ids=tuple(range(5)), agent_url="http://a", agent_from=13)  # fmt: skip
    here, there = spec.parts(4)  # 13 -> block 3 (token 12): blocks 1-2 here, 3-4 through the agent
    assert (here.hashes, here.first_block, here.start_token, here.end_token, here.agent_url) == (
        ("a", "b"), 1, 6, 12, "")  # fmt: skip
    assert (there.hashes, there.first_block, there.start_token, there.end_token, there.agent_url) == (
        ("c", "d"), 3, 12, 20, "http://a")  # fmt: skip
    assert here.agent_from == there.agent_from == 0 and here.vllm_block_ids == spec.vllm_block_ids
    (all_de,) = replace(spec, agent_from=7).parts(4)  # the cut (4) is before the load: all forwarded
    assert all_de.agent_url == "http://a" and all_de.hashes == spec.hashes
    (all_pe,) = replace(spec, agent_from=20).parts(4)  # the cut is at its end: all read here
    assert all_pe.agent_url == "" and all_pe.hashes == spec.hashes
    (plain,) = replace(spec, agent_url="").parts(4)
    assert plain == replace(spec, agent_url="", agent_from=0)


def test_read_source_from_kv_transfer_params() -> None:
    assert read_source("r", None) == ("", True, 0)
    assert read_source("r", {"dualpath": {"read_side": "pe", "snic": False}}) == ("", False, 0)
    de = {"read_side": "de", "agent_url": "http://x:1", "pe_read_len": 8}  # (pe_read_len: split only)
    assert read_source("r", {"dualpath": de}) == ("http://x:1", True, 0)
    assert read_source("r", {"dualpath": {"read_side": "sideways"}}) == ("", True, 0)  # logged, read here
    split = {"read_side": "split", "agent_url": "http://x:1", "pe_read_len": 64, "snic": False}
    assert read_source("r", {"dualpath": split}) == ("http://x:1", False, 64)
    for bad in ({"pe_read_len": -1}, {"pe_read_len": "64"}, {"pe_read_len": True}, {"agent_url": "x:1"}):
        assert read_source("r", {"dualpath": {**split, "snic": True, **bad}}) == ("", True, 0)  # logged
    assert read_source("r", {"dualpath": {k: v for k, v in split.items() if k != "pe_read_len"}}) == (
        "", False, 0)  # fmt: skip
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


@pytest.mark.parametrize("async_load", [False, True])
def test_a_split_load_reads_the_prefix_here_and_the_rest_through_the_agent(
    tmp_path: Path, async_load: bool
) -> None:
    """HitLoader with one split load (blocks 0-1 here, 2-3 forwarded by a decode node's agent) into
    a paged cache: every layer of every vLLM block holds its store block's bytes, and each side's
    counter has exactly its half (layerwise in the step, and as an async job)."""
    import torch

    from dualpath.integrations.vllm.hitload import HitLoader
    from dualpath.integrations.vllm.kvcopy import PagedLayer

    tokens = list(range(17))
    store, hashes, blocks = _store(tmp_path, tokens)
    agent = Agent(store, node_id=1, limiter=None, counters_files=[])
    loader = HitLoader(store, BlockSizes(vllm_block_size=4, store_block_size=4), num_kv_heads=1, head_dim=1,
                       limiter=None, on_done=lambda: None)  # fmt: skip
    caches = [torch.zeros(2, 6, 4, 1, 1) for _ in range(LAYOUT.num_layers)]  # flash layout, 8 B a token
    for layer, cache in enumerate(caches):
        loader.layers[layer] = PagedLayer.of(cache, block_size=4, num_kv_heads=1, head_dim=1)
    vllm_ids = (5, 0, 3, 1)
    try:
        with BackgroundServer(make_app(agent)) as srv:
            spec = replace(
                _spec(hashes, srv.url), vllm_block_ids=vllm_ids, agent_from=8, async_load=async_load
            )
            loader.start([spec])
            if async_load:
                deadline = time.monotonic() + 30
                while not (done := loader.finished(idle_wait_s=0.1)) and time.monotonic() < deadline:
                    pass
                assert done == {"r"}
            else:
                for layer in range(LAYOUT.num_layers):
                    loader.wait_layer(layer)
            assert loader.errors() == set()
        nbytes = LAYOUT.layer_block_bytes
        assert loader.counters["read_bytes"] == 2 * 3 * nbytes  # blocks 0-1, every layer, here
        assert loader.counters["forwarded_in_bytes"] == 2 * 3 * nbytes  # blocks 2-3 through the agent
        assert loader.counters["loaded_blocks"] == 4
        for layer, paged in loader.layers.items():
            got = paged.gather(list(vllm_ids)).numpy().view(np.uint8).reshape(4, nbytes)
            for j in range(4):
                assert np.array_equal(got[j], LAYOUT.layer_view(blocks[j], layer)), (layer, j)
    finally:
        loader.close()
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


def test_pdbench_ratios_name_each_mode_over_each_baseline() -> None:
    from dualpath.integrations.vllm.pdbench import DEFAULT_MODES, MODES, ratios

    assert "split" in MODES and "split" not in DEFAULT_MODES and MODES["split"] == ("dualpath-split", True)
    modes = {"basic": 1.0, "dualpath": 2.0, "split": 2.5, "no-io": 4.0}
    got = ratios({"modes": {m: {"turns_per_s": v} for m, v in modes.items()}})
    assert got == {"dualpath_over_basic": 2.0, "dualpath_over_noio": 0.5, "split_over_basic": 2.5,
                   "split_over_noio": 0.625}  # fmt: skip
    assert ratios({"modes": {"basic": {"turns_per_s": 1.0}, "dualpath": {"turns_per_s": 3.0}}}) == {
        "dualpath_over_basic": 3.0
    }


def test_pdbench_modes_are_parsed_once_for_the_cli_and_the_benchmark() -> None:
    from dualpath.integrations.vllm.pdbench import parse_modes

    assert parse_modes(" basic, split ,,no-io") == ["basic", "split", "no-io"]
    with pytest.raises(ConfigError, match=r"--pd-modes='fast'"):
        parse_modes("basic,fast", "--pd-modes")

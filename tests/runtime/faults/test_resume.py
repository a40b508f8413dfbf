"""Issue 31, no request lost to one engine's death, on a real supervised local cluster (tiny model,
1 PE + 2 DEs, CURVE, warm standby, the real HTTP API): kill -9 of a decode engine while requests
decode, on the PE read path (``basic``) and the DE read path (``always-de``): every request resumes
on the other DE from the tokens its client has (their KV up to the last persisted block read from
the store, the tail recomputed) and finishes with greedy tokens equal to a fault-free forward, no
token repeated; non-streaming HTTP requests get a normal answer (before: 503 "request lost after it
started streaming"); kill -9 of the prefill engine mid-prefill: its requests prefill again on the
restarted PE and finish."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
import torch

from dualpath.runtime.cluster.api import SamplingParams, TokenEvent
from dualpath.runtime.cluster.client import ClusterClient
from dualpath.runtime.cluster.config import ClusterConfig, EngineConfig, SchedulerServiceConfig
from dualpath.runtime.cluster.local import LocalCluster
from dualpath.runtime.server import BackgroundServer, CharTokenizer, ServerConfig, create_app

PE, DE_A, DE_B = 0, 1, 2
LONG = SamplingParams(max_tokens=400, ignore_eos=True)


@dataclass
class Rig:
    cluster: LocalCluster
    url: str

    def wait_whole(self) -> None:
        """Every engine alive, nothing down, a request answered."""
        deadline = time.monotonic() + 90
        while True:
            h = self.cluster.health()
            if h is not None and h.ok and len(h.engines) == 3 and all(e.alive for e in h.engines):
                if not h.unavailable:
                    break
            assert time.monotonic() < deadline, h
            time.sleep(0.2)
        r = httpx.post(self.url + "/v1/completions", json={"model": "tiny", "prompt": "hi"}, timeout=60)
        assert r.status_code == 200, r.text

    def configure(self, policy: str) -> None:
        async def main() -> None:
            async with ClusterClient(self.cluster.address, keys=self.cluster.keys) as client:
                await client.configure(policy)

        asyncio.run(main())


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    cfg = ClusterConfig(
        kv_dir=str(tmp_path_factory.mktemp("kv")),
        model="tiny",
        num_prefill_engines=1,
        num_decode_engines=2,
        engine=EngineConfig(heartbeat_s=0.1, attention_s_per_gflop=0.05),
        scheduler=SchedulerServiceConfig(engine_timeout_s=3.0),
    )
    with LocalCluster(cfg, auth=True, standby=True) as cluster:
        app = create_app(
            cluster.address,
            CharTokenizer(vocab_size=512),
            ServerConfig(model_name="tiny", cluster_key_file=str(cluster.key_file)),
        )
        with BackgroundServer(app) as srv:
            yield Rig(cluster, srv.url)


def _reference(rig: Rig, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens of one process's full forward: what a fault-free run gives."""
    from dualpath.runtime.model import load_decoder

    torch.set_num_threads(1)
    dec, _ = load_decoder(str(rig.cluster.run_dir / "tiny-model"), device="cpu")
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(torch.argmax(dec.forward_full(ids)[-1]).item()))
    return ids[len(prompt) :]


async def _kill_while_decoding(rig: Rig, prompts: list[list[int]], at_tokens: int) -> list[list[TokenEvent]]:
    """Stream every prompt; once each has ``at_tokens`` tokens, kill -9 decode engine DE_A."""
    async with ClusterClient(rig.cluster.address, keys=rig.cluster.keys) as client:
        events: list[list[TokenEvent]] = [[] for _ in prompts]
        ready = [asyncio.Event() for _ in prompts]

        async def one(i: int) -> None:
            async for ev in client.generate(prompts[i], LONG):
                events[i].append(ev)
                if len(events[i]) >= at_tokens:
                    ready[i].set()

        tasks = [asyncio.ensure_future(one(i)) for i in range(len(prompts))]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in ready)), 60)
        rig.cluster.signal(f"engine{DE_A}", signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
        return events


@pytest.mark.parametrize("policy,side", [("basic", "pe"), ("always-de", "de")])
def test_requests_of_a_dead_decode_engine_resume_on_the_other(rig: Rig, policy: str, side: str) -> None:
    rig.wait_whole()
    rig.configure(policy)
    try:
        rng = random.Random(11 if side == "pe" else 12)
        prompts = [[rng.randrange(3, 512) for _ in range(70 + 9 * i)] for i in range(4)]
        retried = _metric(rig, "dualpath_requests_retried_total")
        events = asyncio.run(_kill_while_decoding(rig, prompts, at_tokens=90))
    finally:
        rig.wait_whole()
        rig.configure("dualpath")
    resumed = 0
    for prompt, evs in zip(prompts, events, strict=True):
        assert [e.index for e in evs] == list(range(LONG.max_tokens)), evs[-1]  # none repeated or lost
        last = evs[-1]
        assert last.finish_reason == "length" and last.stats is not None, last
        assert [e.token_id for e in evs] == _reference(rig, prompt, LONG.max_tokens)
        if last.stats.hit_len > 0:  # resumed: its persisted prompt + generated blocks were read
            resumed += 1
            assert last.stats.decode_engine == DE_B and last.stats.read_side == side, last.stats
            assert last.stats.hit_len >= 64 * ((len(prompt) + 90) // 64), last.stats
    assert resumed >= 1  # (the balanced placement puts some of the four on DE_A)
    assert _metric(rig, "dualpath_requests_retried_total") >= retried + resumed
    assert _metric(rig, "dualpath_cluster_failed_total") == 0


def test_non_streaming_requests_of_a_dead_decode_engine_get_their_answer(rig: Rig) -> None:
    """Before: 503 "request lost after it started streaming" for the ones on the dead DE."""
    rig.wait_whole()
    texts = [f"tell me story number {i}" for i in range(4)]

    def post(i: int, stream: bool = False) -> httpx.Response:
        body = {"model": "tiny", "prompt": texts[i], "max_tokens": 400, "ignore_eos": True,
                "temperature": 0, "return_token_ids": True, "stream": stream}  # fmt: skip
        return httpx.post(rig.url + "/v1/completions", json=body, timeout=120)

    with ThreadPoolExecutor(8) as pool:
        plain = [pool.submit(post, i) for i in range(2)]
        streamed = [pool.submit(post, i, True) for i in range(2, 4)]
        _wait_decoding(rig, DE_A)
        rig.cluster.signal(f"engine{DE_A}", signal.SIGKILL)
        answers = [f.result() for f in plain]
        sse = [f.result() for f in streamed]
    got = []
    for r in answers:
        assert r.status_code == 200, r.text
        got.append(r.json()["choices"][0]["token_ids"])
    for r in sse:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        assert not any("error" in c for c in chunks), chunks[-1]
        got.append([t for c in chunks if c.get("choices") for t in c["choices"][0]["token_ids"]])
    rig.wait_whole()
    with ThreadPoolExecutor(4) as pool:  # the same requests again, nothing killed
        fault_free = [r.json()["choices"][0]["token_ids"] for r in pool.map(post, range(4))]
    assert [len(g) for g in got] == [400] * 4
    refs = [_reference(rig, CharTokenizer(vocab_size=512).encode(t), 400) for t in texts]
    for i, (g, f, ref) in enumerate(zip(got, fault_free, refs, strict=True)):
        first = next((k for k, (a, b) in enumerate(zip(g, ref, strict=True)) if a != b), None)
        assert first is None, (i, first, g[max(first - 3, 0) : first + 3], ref[max(first - 3, 0) : first + 3])
        assert g == f


def _wait_decoding(rig: Rig, de: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        h = rig.cluster.health()
        if h is not None and any(e.engine_id == de and e.num_seqs > 0 for e in h.engines):
            time.sleep(0.3)  # (let them stream a while)
            return
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_requests_of_a_dead_prefill_engine_prefill_again_and_finish(rig: Rig) -> None:
    rig.wait_whole()
    rng = random.Random(13)
    prompts = [[rng.randrange(3, 512) for _ in range(1500 + 100 * i)] for i in range(3)]
    params = SamplingParams(max_tokens=8, ignore_eos=True)

    async def main() -> list[list[TokenEvent]]:
        async with ClusterClient(rig.cluster.address, keys=rig.cluster.keys) as client:

            async def one(p: list[int]) -> list[TokenEvent]:
                return [ev async for ev in client.generate(p, params)]

            tasks = [asyncio.ensure_future(one(p)) for p in prompts]
            await asyncio.sleep(0.2)  # (submitted; the PE holds them)
            rig.cluster.signal(f"engine{PE}", signal.SIGKILL)
            return list(await asyncio.wait_for(asyncio.gather(*tasks), 120))

    for prompt, evs in zip(prompts, asyncio.run(main()), strict=True):
        assert evs[-1].finish_reason == "length", evs[-1]
        assert [e.index for e in evs] == list(range(8))
        assert [e.token_id for e in evs] == _reference(rig, prompt, 8)
    rig.wait_whole()


def _metric(rig: Rig, name: str) -> float:
    for line in httpx.get(rig.url + "/metrics", timeout=30).text.splitlines():
        head, _, value = line.rpartition(" ")
        if head == name:
            return float(value)
    return 0.0


def test_requests_sent_while_the_prefill_engine_restarts_wait_for_it(rig: Rig) -> None:
    """The cluster's only PE is dead and being restarted: a request sent meanwhile waits for it and
    finishes (before: 503 "no live prefill and decode engine")."""
    rig.wait_whole()
    rig.cluster.signal(f"engine{PE}", signal.SIGKILL)
    deadline = time.monotonic() + 30
    while (h := rig.cluster.health()) is None or any(e.alive for e in h.engines if e.role == "prefill"):
        assert time.monotonic() < deadline, h
        time.sleep(0.02)
    texts = [f"while the prefill engine restarts {i}" for i in range(3)]

    def post(text: str) -> httpx.Response:
        body = {"model": "tiny", "prompt": text, "max_tokens": 5, "ignore_eos": True, "temperature": 0,
                "return_token_ids": True}  # fmt: skip
        return httpx.post(rig.url + "/v1/completions", json=body, timeout=120)

    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(post, texts))
    for text, r in zip(texts, answers, strict=True):
        assert r.status_code == 200, r.text
        tok = CharTokenizer(vocab_size=512)
        assert r.json()["choices"][0]["token_ids"] == _reference(rig, tok.encode(text), 5)
    rig.wait_whole()

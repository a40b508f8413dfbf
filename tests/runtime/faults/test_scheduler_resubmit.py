"""Issue 31, requests in flight when the scheduler dies, on a real supervised local cluster (tiny
model, 1 PE + 2 DEs, CURVE, the real HTTP API): kill -9 of the scheduler with requests queued
(nothing streamed yet): the HTTP server submits them again to the restarted scheduler and every
one finishes (before: each failed, 503 or an error event); with requests that had streamed tokens:
they go on after the tokens their clients have, no error, no token repeated, greedy tokens equal
to a fault-free forward; with resubmission off (``resubmit_s=0``), a stream ends cleanly with an
error event naming the scheduler."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import threading
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

TOK = CharTokenizer(vocab_size=512)
PE = 0


@dataclass
class Rig:
    cluster: LocalCluster
    url: str

    def wait_whole(self, scheduler_restarts: int | None = None) -> None:
        """Every engine alive, nothing down (the scheduler restarted that often), a request answered."""
        deadline = time.monotonic() + 90
        while True:
            h = self.cluster.health()
            if h is not None and h.ok and len(h.engines) == 3 and all(e.alive for e in h.engines):
                restarted = self.cluster.restarts.get("scheduler", 0)
                if not h.unavailable and scheduler_restarts in (None, restarted):
                    break
            assert time.monotonic() < deadline, (h, self.cluster.restarts)
            time.sleep(0.2)
        assert self.post("hi", 2).status_code == 200

    def post(self, prompt: str, max_tokens: int, stream: bool = False) -> httpx.Response:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0, "return_token_ids": True, "stream": stream}  # fmt: skip
        return httpx.post(self.url + "/v1/completions", json=body, timeout=180)


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
    with LocalCluster(cfg, auth=True) as cluster:  # (as dualpath serve runs it)
        app = create_app(
            cluster.address, TOK, ServerConfig(model_name="tiny", cluster_key_file=str(cluster.key_file))
        )
        with BackgroundServer(app) as srv:
            r = Rig(cluster, srv.url)
            r.wait_whole()
            yield r


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


def _answer_ids(r: httpx.Response) -> list[int]:
    assert r.status_code == 200, r.text
    return list(r.json()["choices"][0]["token_ids"])


def test_queued_requests_are_resubmitted_to_the_restarted_scheduler(rig: Rig) -> None:
    """kill -9 of the scheduler while six requests wait (the PE is stopped, so nothing streamed):
    all six finish (three streamed, three not) with greedy tokens equal to a fault-free forward,
    resubmitted to the restarted scheduler once the PE (continued) registers with it."""
    rig.wait_whole()
    before = rig.cluster.restarts.get("scheduler", 0)
    rng = random.Random(21)
    texts = ["".join(rng.choice("abcdefghij ") for _ in range(200 + 50 * i)) for i in range(6)]
    killed = threading.Event()
    early: list[int] = []  # tokens a streaming request had when the scheduler was killed

    def streamed(text: str) -> list[int]:
        body = {"model": "tiny", "prompt": text, "max_tokens": 6, "ignore_eos": True, "temperature": 0,
                "return_token_ids": True, "stream": True}  # fmt: skip
        ids: list[int] = []
        with httpx.stream("POST", rig.url + "/v1/completions", json=body, timeout=180) as r:
            assert r.status_code == 200
            lines: list[str] = []
            for line in filter(None, r.iter_lines()):
                lines.append(line)
                assert "error" not in line, line
                if line.startswith("data: {"):
                    c = json.loads(line[6:])
                    ids.extend(t for ch in c.get("choices", ()) for t in ch["token_ids"])
                    if not killed.is_set():
                        early.append(len(ids))
        assert line == "data: [DONE]"
        return ids

    resubmitted = _metric(rig, "dualpath_requests_resubmitted_total")
    rig.cluster.signal(f"engine{PE}", signal.SIGSTOP)  # (so that they wait: nothing streams)
    with ThreadPoolExecutor(6) as pool:
        futs = [
            pool.submit(streamed, t) if i % 2 else pool.submit(rig.post, t, 6) for i, t in enumerate(texts)
        ]
        try:
            _wait_queued(rig, 6)
            rig.cluster.signal("scheduler", signal.SIGKILL)
            killed.set()
            time.sleep(1.0)  # (the restarted scheduler has no PE yet: resubmissions wait for it)
        finally:
            rig.cluster.signal(f"engine{PE}", signal.SIGCONT)
        answers = [f.result() for f in futs]
    assert not early  # (none had streamed a token: all were resubmitted with nothing)
    for i, (text, got) in enumerate(zip(texts, answers, strict=True)):
        ids = got if i % 2 else _answer_ids(got)
        assert ids == _reference(rig, TOK.encode(text), 6), i
    rig.wait_whole(before + 1)
    assert _metric(rig, "dualpath_requests_resubmitted_total") == resubmitted + 6


def _metric(rig: Rig, name: str) -> float:
    for line in httpx.get(rig.url + "/metrics", timeout=30).text.splitlines():
        head, _, value = line.rpartition(" ")
        if head == name:
            return float(value)
    raise AssertionError(f"{name} not in /metrics")


def _wait_queued(rig: Rig, n: int) -> None:
    """Until the scheduler holds ``n`` requests."""
    deadline = time.monotonic() + 30
    while (h := rig.cluster.health()) is None or h.num_waiting + h.num_running < n:
        assert time.monotonic() < deadline, h
        time.sleep(0.02)


def test_requests_that_streamed_tokens_go_on_after_them(rig: Rig) -> None:
    """kill -9 of the scheduler mid-stream: each stream goes on after the tokens its client has
    (their KV, up to the last persisted block, read from the store), no error, no repeat."""
    rig.wait_whole()
    before = rig.cluster.restarts.get("scheduler", 0)
    rng = random.Random(22)
    prompts = [[rng.randrange(3, 512) for _ in range(60 + 7 * i)] for i in range(3)]
    params = SamplingParams(max_tokens=500, ignore_eos=True)

    async def main() -> tuple[list[list[TokenEvent]], list[int]]:
        async with ClusterClient(rig.cluster.address, keys=rig.cluster.keys) as client:
            events: list[list[TokenEvent]] = [[] for _ in prompts]
            ready = asyncio.Event()

            async def one(i: int) -> None:
                async for ev in client.generate(prompts[i], params):
                    events[i].append(ev)
                    if len(events[i]) >= 80:
                        ready.set()

            tasks = [asyncio.ensure_future(one(i)) for i in range(len(prompts))]
            await asyncio.wait_for(ready.wait(), 60)
            at_kill = [len(e) for e in events]
            rig.cluster.signal("scheduler", signal.SIGKILL)
            await asyncio.wait_for(asyncio.gather(*tasks), 120)
            return events, at_kill

    events, at_kill = asyncio.run(main())
    assert max(at_kill) < params.max_tokens and max(at_kill) >= 80, at_kill
    for prompt, evs, k in zip(prompts, events, at_kill, strict=True):
        assert [e.index for e in evs] == list(range(params.max_tokens)), evs[-1]  # none repeated
        assert evs[-1].finish_reason == "length" and evs[-1].stats is not None, evs[-1]
        assert evs[-1].stats.hit_len >= 64 * ((len(prompt) + k) // 64) - 64, (k, evs[-1].stats)
        assert [e.token_id for e in evs] == _reference(rig, prompt, params.max_tokens)
    rig.wait_whole(before + 1)


def test_an_http_stream_survives_a_scheduler_restart(rig: Rig) -> None:
    """The same through the HTTP server's SSE stream: 300 tokens, no error event, [DONE]."""
    rig.wait_whole()
    before = rig.cluster.restarts.get("scheduler", 0)
    text = "a long answer please"
    body = {"model": "tiny", "prompt": text, "max_tokens": 300, "ignore_eos": True, "temperature": 0,
            "return_token_ids": True, "stream": True}  # fmt: skip
    lines: list[str] = []
    with httpx.stream("POST", rig.url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in filter(None, r.iter_lines()):
            lines.append(line)
            if len(lines) == 20:
                rig.cluster.signal("scheduler", signal.SIGKILL)
    chunks = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: {")]
    assert lines[-1] == "data: [DONE]" and not any("error" in c for c in chunks), lines[-3:]
    ids = [t for c in chunks if c.get("choices") for t in c["choices"][0]["token_ids"]]
    assert ids == _reference(rig, TOK.encode(text), 300)
    rig.wait_whole(before + 1)


def test_without_resubmission_a_stream_ends_with_a_clear_error(rig: Rig) -> None:
    rig.wait_whole()
    before = rig.cluster.restarts.get("scheduler", 0)

    async def main() -> list[TokenEvent]:
        async with ClusterClient(rig.cluster.address, keys=rig.cluster.keys, resubmit_s=0) as client:
            evs: list[TokenEvent] = []
            async for ev in client.generate([7] * 50, SamplingParams(max_tokens=300, ignore_eos=True)):
                evs.append(ev)
                if len(evs) == 10:
                    rig.cluster.signal("scheduler", signal.SIGKILL)
            return evs

    evs = asyncio.run(asyncio.wait_for(main(), 60))
    assert evs[-1].finish_reason == "error" and "scheduler" in (evs[-1].error or ""), evs[-1]
    assert [e.index for e in evs] == list(range(len(evs)))  # (the error event is the next index)
    rig.wait_whole(before + 1)


def test_a_request_sent_while_the_scheduler_restarts_waits_for_it(rig: Rig) -> None:
    """Sent once the server has seen the scheduler's connection drop (its /health 503): served by
    the restarted scheduler (before: 503 at once)."""
    rig.wait_whole()
    before = rig.cluster.restarts.get("scheduler", 0)
    rig.cluster.signal("scheduler", signal.SIGKILL)
    deadline = time.monotonic() + 10
    while httpx.get(rig.url + "/health", timeout=30).status_code != 503:
        assert time.monotonic() < deadline, "the server never saw the scheduler gone"
        time.sleep(0.01)
    r = rig.post("sent while the scheduler restarts", 5)
    assert _answer_ids(r) == _reference(rig, TOK.encode("sent while the scheduler restarts"), 5)
    rig.wait_whole(before + 1)

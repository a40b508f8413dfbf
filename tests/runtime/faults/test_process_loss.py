"""Issue 13, process loss on a real supervised local cluster (tiny model, 1 PE + 2 DEs, CURVE, the
real HTTP API): kill -9 of the prefill engine, of a decode engine and of the scheduler mid-stream;
SIGSTOP of an engine past the heartbeat timeout; an engine loading. Each test says who fails, who
finishes, and waits for the cluster to serve again with everything alive (a stream across a dead
scheduler: resubmitted, it finishes, issue 31).

Before supervision: a dead PE failed every request already decoding on the healthy DEs, then the
cluster stayed down (503 forever); a dead DE was never restarted and /health said "ok"; a dead
scheduler cut streams without an error event or ``[DONE]``, gave 500 to non-streaming calls and
15 s waits to new ones."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import msgspec
import pytest

from dualpath.runtime.cluster.api import ClusterHealth, SamplingParams, TokenEvent
from dualpath.runtime.cluster.client import ClusterClient
from dualpath.runtime.cluster.config import (
    ClusterConfig,
    EngineConfig,
    SchedulerServiceConfig,
    SupervisorConfig,
)
from dualpath.runtime.cluster.local import LocalCluster
from dualpath.runtime.server import BackgroundServer, CharTokenizer, ServerConfig, create_app

LONG = SamplingParams(max_tokens=300, ignore_eos=True)
PE, DE_A, DE_B = 0, 1, 2


@dataclass
class Rig:
    cluster: LocalCluster
    url: str

    def health(self) -> ClusterHealth:
        deadline = time.monotonic() + 30
        while (h := self.cluster.health()) is None:
            assert time.monotonic() < deadline, "the scheduler does not answer"
            time.sleep(0.1)
        return h

    def wait_serving(self, restarts: dict[str, int]) -> ClusterHealth:
        """Every engine alive again, the supervisor's restarts as given, /health "ok", and a
        request answered."""
        deadline = time.monotonic() + 90
        while True:
            h = self.cluster.health()
            if (
                h is not None
                and h.ok
                and all(e.alive for e in h.engines)
                and len(h.engines) == 3
                and not h.unavailable
                and self.cluster.restarts == restarts
                and h.restarts == restarts
            ):
                break
            assert time.monotonic() < deadline, (h, self.cluster.restarts)
            time.sleep(0.2)
        r = httpx.get(self.url + "/health", timeout=30)
        assert r.status_code == 200 and r.json()["status"] == "ok", r.text
        r = self.chat()
        assert r.status_code == 200, r.text
        return h

    def chat(self, stream: bool = False, max_tokens: int = 4) -> httpx.Response:
        body = {
            "model": "tiny",
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": stream,
            "messages": [{"role": "user", "content": "hello"}],
        }
        return httpx.post(self.url + "/v1/chat/completions", json=body, timeout=120)

    def metric(self, name: str, **labels: str) -> float:
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in httpx.get(self.url + "/metrics", timeout=30).text.splitlines():
            head, _, value = line.rpartition(" ")
            if head == (f"{name}{{{want}}}" if want else name):
                return float(value)
        return 0.0


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    cfg = ClusterConfig(
        kv_dir=str(tmp_path_factory.mktemp("kv")),
        model="tiny",
        num_prefill_engines=1,
        num_decode_engines=2,
        engine=EngineConfig(heartbeat_s=0.1, attention_s_per_gflop=0.05),
        scheduler=SchedulerServiceConfig(engine_timeout_s=3.0),
        supervisor=SupervisorConfig(standby=1, hung_s=8.0),
    )
    with LocalCluster(cfg, auth=True) as cluster:  # (as dualpath serve runs it)
        app = create_app(
            cluster.address,
            CharTokenizer(vocab_size=512),
            ServerConfig(model_name="tiny", cluster_key_file=str(cluster.key_file)),
        )
        with BackgroundServer(app) as srv:
            yield Rig(cluster, srv.url)


async def _streams(
    rig: Rig, n: int, kill: str, sig: int = signal.SIGKILL
) -> tuple[list[list[TokenEvent]], list[int]]:
    """``n`` long requests; once each has streamed a token, send ``sig`` to ``kill``. Returns
    each request's events and how many tokens it had when the signal went."""
    async with ClusterClient(rig.cluster.address, keys=rig.cluster.keys) as client:
        events: list[list[TokenEvent]] = [[] for _ in range(n)]
        started = [asyncio.Event() for _ in range(n)]

        async def one(i: int) -> None:
            async for ev in client.generate([5 + i] * (40 + i), LONG):
                events[i].append(ev)
                started[i].set()

        tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
        await asyncio.wait_for(asyncio.gather(*(s.wait() for s in started)), 60)
        at_kill = [len(e) for e in events]
        rig.cluster.signal(kill, sig)
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 120)
        return events, at_kill


def test_a_dead_prefill_engine_fails_no_request_decoding_elsewhere(rig: Rig) -> None:
    before = dict(rig.cluster.restarts)
    events, at_kill = asyncio.run(_streams(rig, 4, f"engine{PE}"))
    for evs, _n in zip(events, at_kill, strict=True):
        assert evs[-1].finish_reason == "length", evs[-1]  # before: "error" (PE death failed all)
        assert len(evs) == LONG.max_tokens
    assert any(n < LONG.max_tokens for n in at_kill), at_kill  # (some still streamed after the kill)
    rig.wait_serving(before | {"prefill": before.get("prefill", 0) + 1})
    assert rig.metric("dualpath_process_restarts_total", role="prefill") == before.get("prefill", 0) + 1


def test_a_dead_decode_engine_loses_no_stream_and_comes_back(rig: Rig) -> None:
    """Its streams resume on the other DE (issue 31; before: they ended with an error event;
    tests/runtime/faults/test_resume.py checks the tokens)."""
    before = dict(rig.cluster.restarts)
    events, at_kill = asyncio.run(_streams(rig, 6, f"engine{DE_A}"))
    for evs in events:
        last = evs[-1]
        assert last.finish_reason == "length" and last.stats is not None, last
        assert last.stats.decode_engine == DE_B
        assert [e.index for e in evs] == list(range(LONG.max_tokens))
    assert any(n < LONG.max_tokens for n in at_kill), at_kill  # (they streamed past the kill)
    rig.wait_serving(before | {"decode": before.get("decode", 0) + 1})


def test_requests_that_streamed_nothing_are_retried_once_on_another_engine(rig: Rig) -> None:
    """The PE is held (SIGSTOP, well under the heartbeat timeout) so nothing streams; a DE holding
    some of the requests is killed; they are re-dispatched and every request finishes."""
    before = dict(rig.cluster.restarts)
    retried = rig.metric("dualpath_requests_retried_total")

    async def main() -> list[list[TokenEvent]]:
        async with ClusterClient(rig.cluster.address, keys=rig.cluster.keys) as client:

            async def one(i: int) -> list[TokenEvent]:
                return [
                    ev
                    async for ev in client.generate(
                        [9 + i] * 50, SamplingParams(max_tokens=20, ignore_eos=True)
                    )
                ]

            rig.cluster.signal(f"engine{PE}", signal.SIGSTOP)
            try:
                tasks = [asyncio.ensure_future(one(i)) for i in range(4)]
                deadline = time.monotonic() + 30
                while sum(e.num_seqs for e in rig.health().engines if e.engine_id == DE_A) == 0:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                rig.cluster.signal(f"engine{DE_A}", signal.SIGKILL)
                await asyncio.sleep(0.3)
            finally:
                rig.cluster.signal(f"engine{PE}", signal.SIGCONT)
            return list(await asyncio.wait_for(asyncio.gather(*tasks), 120))

    for evs in asyncio.run(main()):
        assert evs[-1].finish_reason == "length" and len(evs) == 20, evs[-1]
    assert rig.metric("dualpath_requests_retried_total") >= retried + 1
    rig.wait_serving(before | {"decode": before.get("decode", 0) + 1})


def test_a_stream_goes_on_across_a_dead_scheduler_then_it_heals(rig: Rig) -> None:
    """Before: the stream was cut with no error and no [DONE]; then (issue 13) it ended with an
    error event; now (issue 31) the HTTP server submits it again to the restarted scheduler with
    the tokens it streamed, and it finishes (tests/runtime/faults/test_scheduler_resubmit.py)."""
    before = dict(rig.cluster.restarts)
    body = {
        "model": "tiny",
        "max_tokens": 300,
        "ignore_eos": True,
        "stream": True,
        "messages": [{"role": "user", "content": "a long answer"}],
    }
    lines: list[str] = []
    with httpx.stream("POST", rig.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            lines.append(line)
            if len(lines) == 12:
                rig.cluster.signal("scheduler", signal.SIGKILL)
    data = [ln.removeprefix("data: ") for ln in lines if ln.startswith("data: ")]
    assert data[-1] == "[DONE]", data[-3:]
    chunks = [json.loads(d) for d in data[:-1]]
    assert not any("error" in c for c in chunks), chunks[-1]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length", chunks[-1]
    r = rig.chat()  # at once, while the scheduler restarts: 503 with Retry-After (before: 500)
    assert r.status_code in (503, 200), r.text
    if r.status_code == 503:
        assert r.headers.get("retry-after"), r.headers
    r = httpx.get(rig.url + "/health", timeout=30)
    assert r.status_code in (503, 200), r.text
    if r.status_code == 503:
        assert r.json()["status"] == "unhealthy" and r.json()["unavailable"], r.text
    h = rig.wait_serving(before | {"scheduler": before.get("scheduler", 0) + 1})
    assert {e.engine_id for e in h.engines} == {PE, DE_A, DE_B}  # re-registered under their ids


def test_a_stopped_engine_is_declared_dead_then_heals(rig: Rig) -> None:
    before = dict(rig.cluster.restarts)
    deaths = rig.metric("dualpath_engine_deaths_total")
    rig.cluster.signal(f"engine{DE_B}", signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 60
        while not any(
            d.what == f"decode engine {DE_B}" and d.state == "dead" for d in rig.health().unavailable
        ):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        r = httpx.get(rig.url + "/health", timeout=30)
        assert r.status_code == 200 and r.json()["status"] == "degraded", r.text
        item = next(d for d in r.json()["unavailable"] if d["what"] == f"decode engine {DE_B}")
        assert item["state"] == "dead" and item["since"] and item["for_s"] >= 0
        assert rig.chat().status_code == 200  # the other DE serves meanwhile
    finally:
        rig.cluster.signal(f"engine{DE_B}", signal.SIGCONT)
    rig.wait_serving(before)  # healed (revived), not restarted
    assert rig.metric("dualpath_engine_deaths_total") == deaths + 1
    assert rig.metric("dualpath_engine_revivals_total") >= 1


def test_an_engine_stopped_for_good_is_killed_and_restarted(rig: Rig) -> None:
    """SIGSTOP with no SIGCONT: declared dead after the heartbeat timeout, then, held dead past the
    supervisor's ``hung_s`` (8 s here, 20 s by default) while its process exists, killed and
    restarted."""
    before = dict(rig.cluster.restarts)
    rig.cluster.signal(f"engine{DE_B}", signal.SIGSTOP)
    rig.wait_serving(before | {"decode": before.get("decode", 0) + 1})
    events = rig.cluster.events
    assert any(f"decode engine {DE_B}" in e and "held dead for" in e for e in events), events


def test_a_loading_engine_is_reported_loading_and_never_declared_dead(rig: Rig) -> None:
    """An extra prefill engine joins: it profiles its attention predictor before registering (a
    long load); the scheduler lists it as loading meanwhile, and it registers alive."""
    from dualpath.runtime.cluster.engine_main import EngineArgs
    from dualpath.runtime.cluster.local import tiny_model_dir

    deaths = rig.metric("dualpath_engine_deaths_total")
    cfg = rig.cluster.config
    args = EngineArgs(
        cluster=msgspec.structs.replace(cfg, model=str(tiny_model_dir(rig.cluster.run_dir))),
        scheduler=rig.cluster.address,
        role="prefill",
        node_id=9,
        engine_id=-1,
        key_file=str(rig.cluster.key_file),
        cluster_id=rig.cluster.cluster_id,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "dualpath.runtime.cluster.engine_main", msgspec.json.encode(args).decode()],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + 120
        while True:
            h = rig.health()
            seen |= {d.state for d in h.unavailable if "node 9" in d.what}
            if any(e.node_id == 9 and e.alive for e in h.engines):
                break
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        assert "loading" in seen
        assert rig.metric("dualpath_engine_deaths_total") == deaths
    finally:
        proc.terminate()
        proc.wait(30)


def test_restart_backoff_doubles_and_is_capped() -> None:
    from dualpath.runtime.cluster.supervisor import backoff_s

    assert [backoff_s(k, 0.5, 4.0) for k in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]

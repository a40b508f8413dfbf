"""The scheduler service in this process, driven message by message with fake engine sockets and
a test clock: dispatch, declaring a silent engine dead, and taking it back when it answers again."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from dualpath.policy.scheduler import is_central
from dualpath.runtime.cluster.api import SamplingParams
from dualpath.runtime.cluster.config import ClusterConfig, SchedulerServiceConfig
from dualpath.runtime.cluster.messages import (
    DecodeTask,
    EngineHello,
    Heartbeat,
    Peers,
    PrefillTask,
    Query,
    QueryReply,
    Rejected,
    Reset,
    Submit,
    Tokens,
    Welcome,
    decode,
    encode,
)
from dualpath.runtime.cluster.scheduler import SchedulerArgs, SchedulerService


class _Rig:
    def __init__(self, kv_dir: Path, scheduler: SchedulerServiceConfig | None = None) -> None:
        scheduler = scheduler or SchedulerServiceConfig(engine_timeout_s=1.0)
        cluster = ClusterConfig(kv_dir=str(kv_dir), scheduler=scheduler)
        self.svc = SchedulerService(SchedulerArgs(cluster=cluster))
        self.poller = zmq.Poller()
        self.poller.register(self.svc.sock, zmq.POLLIN)
        self.ctx = zmq.Context()
        self.socks: list[zmq.Socket] = []
        self.held: dict[int, list[object]] = {}  # answers that came before a sync's reply
        self.now = 1000.0

    def dealer(self) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.svc.address)
        self.socks.append(s)
        return s

    def pump(self, dt: float = 0.0, step: float = 0.1) -> None:
        """Advance the test clock by ``dt`` in ticks ``step`` apart, handling what arrived."""
        end = self.now + dt
        while True:
            self.now = min(self.now + step, end)
            for _ in range(3):
                self.svc.run_once(self.poller, 10, now=self.now)
            if self.now >= end:
                return

    def until_reply(self, sock: zmq.Socket, timeout_s: float = 10.0) -> object:
        """Handle messages at the current test time until ``sock`` gets an answer (a loaded
        machine may take a while to deliver); return it."""
        deadline = time.monotonic() + timeout_s
        while not sock.poll(0):
            assert time.monotonic() < deadline, "no answer from the scheduler"
            self.svc.run_once(self.poller, 10, now=self.now)
        return decode(sock.recv_multipart()[-1])

    def synced(self, sock: zmq.Socket) -> None:
        """Wait until everything ``sock`` sent so far was handled: one DEALER's messages arrive in
        order, so the answer to a query sent after them proves it."""
        sock.send_multipart([b"", encode(Query(query_id=99, what="info"))])
        while True:
            reply = self.until_reply(sock)
            if isinstance(reply, QueryReply) and reply.query_id == 99:
                return
            self.held.setdefault(id(sock), []).append(reply)

    def engine(self, eid: int, role: str, node: int, **hello: object) -> zmq.Socket:
        s = self.dealer()
        s.send(encode(self.hello(eid, role, node, **hello)))
        reply = self.until_reply(s)
        assert isinstance(reply, Welcome), reply
        return s

    @staticmethod
    def hello(eid: int, role: str, node: int, **extra: object) -> EngineHello:
        fields: dict[str, object] = dict(
            engine_id=eid,
            role=role,
            node_id=node,
            data_addr=f"tcp://x:{eid}",
            pid=eid,
            hbm_tokens=100_000 if role == "decode" else 0,
            num_layers=2,
            kv_bytes_per_token_layer=64,
            block_size=16,
            vocab_size=100,
            max_context_len=4096,
        )
        return EngineHello(**(fields | extra))  # type: ignore[arg-type]

    def submit(self, client: zmq.Socket, rid: str, prompt_len: int, max_tokens: int) -> None:
        client.send_multipart(
            [
                b"",
                encode(
                    Submit(
                        request_id=rid,
                        prompt_token_ids=list(range(prompt_len)),
                        params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                    )
                ),
            ]
        )
        self.synced(client)
        self.pump()

    def heartbeat(self, eid: int) -> None:
        d = self.dealer()
        d.send(
            encode(
                Heartbeat(
                    engine_id=eid,
                    num_seqs=0,
                    num_tokens=0,
                    read_queue_tokens=0,
                    bytes_by_path={},
                    bytes_by_nic={},
                )
            )
        )
        self.synced(d)

    def query(self, what: str) -> QueryReply:
        c = self.dealer()
        c.send_multipart([b"", encode(Query(query_id=7, what=what))])
        reply = self.until_reply(c)
        assert isinstance(reply, QueryReply)
        return reply

    def health(self):  # type: ignore[no-untyped-def]
        h = self.query("health").health
        assert h is not None
        return h

    def close(self) -> None:
        for s in self.socks:
            s.close(0)
        self.ctx.term()
        self.svc.close()


def _next(sock: zmq.Socket, timeout_ms: int = 5000) -> object:
    assert sock.poll(timeout_ms), "no message"
    return decode(sock.recv_multipart()[-1])


def _drain(sock: zmq.Socket, first_ms: int = 2000) -> list[object]:
    """Every message waiting on ``sock``: the first may take up to ``first_ms`` to arrive (loaded
    machines), later ones are taken while they keep coming within 50 ms."""
    out: list[object] = []
    wait = first_ms
    while sock.poll(wait):
        out.append(decode(sock.recv_multipart()[-1]))
        wait = 50
    return out


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[_Rig]:
    r = _Rig(tmp_path)
    yield r
    r.close()


def test_a_stalled_engine_is_declared_dead_then_taken_back_emptied(rig: _Rig) -> None:
    pe = rig.engine(0, "prefill", 0)
    de = rig.engine(1, "decode", 1)
    client = rig.dealer()
    rig.submit(client, "r1", 40, 4)
    assert any(isinstance(m, PrefillTask) and m.request_id == "r1" for m in _drain(pe))
    assert any(isinstance(m, DecodeTask) and m.request_id == "r1" for m in _drain(de))

    # the PE goes silent past the timeout (the DE keeps beating): declared dead; with no PE left,
    # r1 fails at once with a clear error rather than hang
    rig.pump(0.6)
    rig.heartbeat(1)
    rig.pump(0.6)
    h = rig.health()
    assert [e.alive for e in h.engines] == [False, True] and not h.ok
    assert any(
        re.fullmatch(r"prefill engine 0 stopped responding \(no heartbeat for 1\.\d s\)", d) for d in h.down
    ), h.down
    ev = _next(client)
    assert isinstance(ev, Tokens) and ev.events[0].finish_reason == "error"
    assert "no live prefill engine left" in (ev.events[0].error or "")

    # the PE's heartbeat comes again: it is told to drop what it holds, and serves new requests
    _drain(de, first_ms=50)
    rig.heartbeat(0)
    rig.pump()
    got = _drain(pe)
    assert isinstance(got[0], Reset) and "declared dead after" in got[0].reason
    assert any(isinstance(m, Peers) and set(m.peers) == {0, 1} for m in got)
    h = rig.health()
    assert h.ok and all(e.alive for e in h.engines)
    assert h.down == () and h.unavailable == ()  # /health is now; the revival is in the metrics
    m = rig.query("metrics").metrics
    assert m is not None and (m.engine_deaths, m.engine_revivals) == (1, 1)
    assert m.engines_alive == {"prefill": 1, "decode": 1}
    rig.submit(client, "r2", 30, 2)
    assert [m.request_id for m in _drain(pe) if isinstance(m, PrefillTask)] == ["r2"]

    # late tokens of the failed r1 are ignored; r2's reach the client
    from dualpath.runtime.cluster.api import TokenEvent

    de.send(encode(Tokens(events=[TokenEvent(request_id="r1", index=0, token_id=5)])))
    rig.synced(de)
    assert not client.poll(50)
    de.send(encode(Tokens(events=[TokenEvent(request_id="r2", index=0, token_id=6)])))
    rig.synced(de)
    ev = _next(client)
    assert isinstance(ev, Tokens) and ev.events[0].request_id == "r2" and ev.events[0].token_id == 6


def test_a_silent_decode_engine_loses_its_requests_to_the_other_one(rig: _Rig) -> None:
    """Two DEs: when one goes silent, its request (no token streamed yet) is re-dispatched to the
    other under a new attempt key, and nothing reaches the client twice."""
    pe = rig.engine(0, "prefill", 0)
    de1 = rig.engine(1, "decode", 1)
    de2 = rig.engine(2, "decode", 2)
    client = rig.dealer()
    rig.submit(client, "r1", 40, 4)
    first = [m for s in (de1, de2) for m in _drain(s) if isinstance(m, DecodeTask)]
    assert len(first) == 1
    _drain(pe)
    survivor_id = 2 if rig.svc.state.requests["r1"].de == 1 else 1
    survivor = {1: de1, 2: de2}[survivor_id]
    rig.pump(0.6)
    rig.heartbeat(0)
    rig.heartbeat(survivor_id)
    rig.pump(0.6)
    again = [m for m in rig.held.pop(id(survivor), []) + _drain(survivor) if isinstance(m, DecodeTask)]
    assert [m.request_id for m in again] == ["r1#1"]
    assert [m.request_id for m in _drain(pe) if isinstance(m, PrefillTask)] == ["r1#1"]
    assert not client.poll(50)  # the client saw nothing of the lost attempt


def test_the_schedulers_own_stall_does_not_kill_engines(rig: _Rig) -> None:
    """A 3 s gap between two ticks (the scheduler descheduled, or the whole VM paused) is not the
    engines' silence: they stay alive and serve; real silence afterwards still counts."""
    rig.engine(0, "prefill", 0)
    rig.engine(1, "decode", 1)
    rig.pump(3.0, step=3.0)
    assert all(e.alive for e in rig.health().engines)
    rig.pump(1.2)
    assert not any(e.alive for e in rig.health().engines)


def test_the_pe_scope_and_tie_breaks_reach_the_services_policy(tmp_path: Path) -> None:
    """``dualpath serve --pe-scope/--read-tie/--pe-tie`` set the scheduler service's section; the
    policy built when the first engine registers carries them (the runtime's Fetcher then runs the
    same central fetch and tie-breaks as the simulator: tests/policy/test_pe_scope.py, test_ties.py)."""
    opts = SchedulerServiceConfig(
        engine_timeout_s=1.0, pe_scope="central", read_tie="de", pe_tie="read-queue"
    )
    r = _Rig(tmp_path, opts)
    try:
        r.engine(0, "prefill", 0)
        cfg = r.svc.sched.config
        assert (cfg.pe_scope, cfg.read_tie, cfg.pe_tie) == ("central", "de", "read-queue")
        assert is_central(r.svc.sched)
    finally:
        r.close()
    r = _Rig(tmp_path)  # the defaults: the policy's own scope, today's tie-breaks
    try:
        r.engine(0, "prefill", 0)
        cfg = r.svc.sched.config
        assert (cfg.read_tie, cfg.pe_tie) == ("pe", "group") and not is_central(r.svc.sched)
    finally:
        r.close()


def test_an_engine_is_routable_only_once_it_says_it_is_ready(rig: _Rig) -> None:
    """Issue 30 item 3: an engine registers (not ready: it still builds its KV pools and worker),
    then sends EngineReady; only then does /health say "ok" and does the policy route to it.
    Before, registration made it routable at once (requests sent then were lost on SmolLM2)."""
    from dualpath.runtime.cluster.messages import EngineReady, Rejected

    pe = rig.engine(0, "prefill", 0)
    de = rig.engine(1, "decode", 1, ready=False, max_prompt_tokens=50, max_context_tokens=80)
    h = rig.health()
    assert not h.ok and {e.engine_id: e.state for e in h.engines} == {0: "ready", 1: "starting"}
    assert [d.state for d in h.unavailable] == ["starting"]
    client = rig.dealer()
    rig.submit(client, "early", 30, 2)
    got = rig.held.pop(id(client), []) + _drain(client, 200)
    assert any(isinstance(m, Rejected) and m.kind == "unavailable" for m in got), got
    forged = rig.dealer()  # (another socket cannot say engine 1 is ready)
    forged.send(encode(EngineReady(engine_id=1, pid=1)))
    rig.synced(forged)
    assert not rig.health().ok
    de.send(encode(EngineReady(engine_id=1, pid=1, rss_bytes=123)))
    rig.synced(de)
    h = rig.health()
    assert h.ok and all(e.state == "ready" for e in h.engines)
    assert next(e for e in h.engines if e.engine_id == 1).rss_bytes == 123
    rig.submit(client, "r1", 30, 2)
    assert [m.request_id for m in _drain(de) if isinstance(m, DecodeTask)] == ["r1"]
    assert [m.request_id for m in _drain(pe) if isinstance(m, PrefillTask)] == ["r1"]
    # what the engine's KV pool holds bounds what is admitted, with the reason
    assert rig.query("info").info.max_context_len == 80  # type: ignore[union-attr]
    rig.submit(client, "long", 60, 2)
    rej = [m for m in rig.held.pop(id(client), []) + _drain(client, 200) if isinstance(m, Rejected)]
    assert rej and rej[0].kind == "too_long" and "raise --kv-cache-memory" in rej[0].reason, rej


def test_a_stale_generation_is_refused(rig: _Rig) -> None:
    """A process of an older incarnation of an engine id (one its successor replaced) cannot
    register over the successor."""
    from dualpath.runtime.cluster.messages import Shutdown

    rig.engine(1, "decode", 1, generation=2)
    old = rig.dealer()
    old.send(encode(rig.hello(1, "decode", 1, generation=1, pid=99, data_addr="tcp://x:99")))
    reply = rig.until_reply(old)
    assert isinstance(reply, Shutdown) and "stale" in reply.reason, reply
    h = rig.health()
    assert [(e.engine_id, e.pid, e.generation) for e in h.engines] == [(1, 1, 2)]


def test_a_supervised_scheduler_keeps_requests_for_a_restarting_engine_before_its_first_report(
    tmp_path: Path,
) -> None:
    """A scheduler its supervisor started (``SchedulerArgs.supervised``; a restart, say) has no
    supervisor report yet: a request sent while its only PE is dead waits for the PE rather than
    being refused (chaos run: one 503 "none being restarted" right after a scheduler restart)."""
    cluster = ClusterConfig(kv_dir=str(tmp_path), scheduler=SchedulerServiceConfig(engine_timeout_s=1.0))
    for supervised, refused in ((True, False), (False, True)):
        rig = _Rig(tmp_path)
        rig.svc.close()
        rig.svc = SchedulerService(SchedulerArgs(cluster=cluster, supervised=supervised))
        rig.poller = zmq.Poller()
        rig.poller.register(rig.svc.sock, zmq.POLLIN)
        rig.now = time.monotonic()
        try:
            rig.engine(0, "prefill", 0)
            rig.engine(1, "decode", 1)
            rig.pump(1.5)  # (the PE goes silent: declared dead; the DE keeps beating)
            rig.heartbeat(1)
            assert [e.alive for e in rig.health().engines] == [False, True]
            client = rig.dealer()
            rig.submit(client, "r1", 40, 4)
            got = rig.held.pop(id(client), []) + _drain(client, first_ms=300)
            assert any(isinstance(m, Rejected) for m in got) == refused, got
        finally:
            rig.close()


def test_a_second_hello_of_the_same_process_re_registers_it_in_place(rig: _Rig) -> None:
    """After a scheduler restart an engine can be asked to register again twice (the second ask
    sent while its first hello waited behind a scheduler rebuilding its store index): it drops
    every task and says hello again from the same process. Before: refused as a duplicate data
    address (Shutdown: the engine exited, its requests failed as "lost again", chaos run). Now:
    welcomed under its id, no death counted, its requests dispatched again."""
    rig.engine(0, "prefill", 0)
    de = rig.engine(1, "decode", 1)
    client = rig.dealer()
    rig.submit(client, "r1", 40, 4)
    assert [m.request_id for m in _drain(de) if isinstance(m, DecodeTask)] == ["r1"]
    de.send(encode(rig.hello(1, "decode", 1, ready=True)))
    rig.synced(de)
    rig.pump()
    got = rig.held.pop(id(de), []) + _drain(de)
    assert any(isinstance(m, Welcome) and m.engine_id == 1 for m in got), got
    assert not any(type(m).__name__ == "Shutdown" for m in got), got
    assert [m.request_id for m in got if isinstance(m, DecodeTask)] == ["r1#1"]
    h = rig.health()
    assert [(e.engine_id, e.alive) for e in h.engines] == [(0, True), (1, True)], h.engines
    m = rig.query("metrics").metrics
    assert m is not None and m.engine_deaths == 0
    assert not client.poll(50)  # (the client saw nothing of it)

"""The scheduler core's token stream, message by message (no sockets, a test clock): the PE's
first token streamed at once, the DE's copy of it dropped, tokens of two engines in order once, a
request resuming after its DE's death from the tokens its client has, and the outcomes a client
ending a request early is counted under."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualpath.runtime.cluster.api import SamplingParams, TokenEvent
from dualpath.runtime.cluster.config import ClusterConfig, SchedulerArgs
from dualpath.runtime.cluster.messages import (
    Abort,
    Cancel,
    DecodeTask,
    EngineHello,
    PrefillTask,
    Progress,
    Submit,
    Tokens,
    encode,
)
from dualpath.runtime.cluster.sched_core import SchedulerCore
from dualpath.runtime.cluster.sched_stream import Streams

CLIENT = b"client"
PE, DE_A, DE_B = 0, 1, 2


class _Core(SchedulerCore):
    def __init__(self, args: SchedulerArgs) -> None:
        super().__init__(args)
        self.sent: list[tuple[bytes, object]] = []

    def _send(self, identity: bytes, msg: object) -> None:
        self.sent.append((identity, msg))

    def _to_client(self, identity: bytes, msg: object) -> None:
        self.sent.append((identity, msg))

    def take(self, kind: type) -> list[tuple[bytes, object]]:
        out = [(i, m) for i, m in self.sent if isinstance(m, kind)]
        self.sent = [(i, m) for i, m in self.sent if not isinstance(m, kind)]
        return out

    def client_events(self) -> list[TokenEvent]:
        return [ev for i, m in self.take(Tokens) if i == CLIENT for ev in m.events]  # type: ignore[attr-defined]


def _ident(eid: int) -> bytes:
    return f"e{eid}".encode()


@pytest.fixture
def core(tmp_path: Path) -> _Core:
    c = _Core(SchedulerArgs(cluster=ClusterConfig(kv_dir=str(tmp_path), policy="basic")))
    for eid, role in ((PE, "prefill"), (DE_A, "decode"), (DE_B, "decode")):
        hello = EngineHello(
            engine_id=eid,
            role=role,
            node_id=eid,
            data_addr=f"tcp://x:{5000 + eid}",
            pid=100 + eid,
            hbm_tokens=100_000 if role == "decode" else 0,
            num_layers=2,
            kv_bytes_per_token_layer=64,
            block_size=16,
            vocab_size=100,
            eos_token_id=99,
            max_context_len=4096,
        )
        c.handle(_ident(eid), encode(hello), 0.0)
    c.sent.clear()
    return c


def _submit(
    core: _Core, rid: str, max_tokens: int, now: float = 1.0, **kw: object
) -> tuple[DecodeTask, PrefillTask]:
    params = SamplingParams(max_tokens=max_tokens, **kw)  # type: ignore[arg-type]
    core.handle(
        CLIENT, encode(Submit(request_id=rid, prompt_token_ids=list(range(1, 41)), params=params)), now
    )
    core.tick(now)
    ((_, de_task),) = core.take(DecodeTask)
    ((_, pe_task),) = core.take(PrefillTask)
    assert isinstance(de_task, DecodeTask) and isinstance(pe_task, PrefillTask)
    return de_task, pe_task


def _prefill_done(core: _Core, key: str, token: int, now: float) -> None:
    msg = Progress(request_id=key, engine_id=PE, event="prefill_done", hit_len=0, first_token=token)
    core.handle(_ident(PE), encode(msg), now)


def _de_tokens(core: _Core, de: int, key: str, toks: list[tuple[int, int]], last: str | None = None,
               now: float = 3.0) -> None:  # fmt: skip
    evs = [TokenEvent(request_id=key, index=i, token_id=t) for i, t in toks]
    if last is not None:
        i, t = toks[-1]
        evs[-1] = TokenEvent(request_id=key, index=i, token_id=t, finish_reason=last)  # type: ignore[arg-type]
    core.handle(_ident(de), encode(Tokens(events=evs)), now)


def test_streams_put_two_engines_tokens_in_order_once() -> None:
    s = Streams()
    s.open("r")
    ev = lambda i, last=None: TokenEvent(request_id="r", index=i, token_id=10 + i, finish_reason=last)  # noqa: E731
    assert s.accept("r", ev(0)) == [ev(0)]
    assert s.accept("r", ev(0)) == []  # the DE's copy of the PE's token
    assert s.accept("r", ev(2)) == []  # ahead of a gap: held
    assert s.accept("r", ev(1)) == [ev(1), ev(2)]
    assert s.accept("r", ev(3, "length")) == [ev(3, "length")]
    assert s.tokens("r") == [10, 11, 12, 13]
    assert s.accept("unknown", ev(0)) == []


def test_the_first_token_streams_from_the_prefill_engine(core: _Core) -> None:
    de_task, _ = _submit(core, "r", max_tokens=3)
    _prefill_done(core, de_task.request_id, 7, now=2.0)
    assert [(e.index, e.token_id) for e in core.client_events()] == [(0, 7)]  # before the DE's
    _de_tokens(core, DE_A if de_task.prefill_engine == PE else DE_B, "r", [(0, 7), (1, 8)])
    assert [(e.index, e.token_id) for e in core.client_events()] == [(1, 8)]  # the copy dropped
    _prefill_done(core, de_task.request_id, 7, now=2.5)  # (a duplicate PE report: still index 0)
    assert core.client_events() == []
    de = next(e for e in (DE_A, DE_B) if core.state.requests["r"].de == e)
    _de_tokens(core, de, "r", [(2, 9)], last="length", now=4.0)
    (last,) = core.client_events()
    assert last.is_last and last.stats is not None
    assert last.stats.ttft_s == pytest.approx(1.0) and last.stats.ttst_s == pytest.approx(2.0)


def test_the_prefill_engines_token_after_the_decode_engines_is_a_duplicate(core: _Core) -> None:
    """The DE may stream tokens 0 and 1 before the PE's report of token 0 arrives: that report
    is token 0 again, never token 2 (it was once sent as token 2)."""
    _submit(core, "r", max_tokens=5)
    de = core.state.requests["r"].de
    _de_tokens(core, de, "r", [(0, 7), (1, 8)])
    _prefill_done(core, "r", 7, now=3.5)
    assert [(e.index, e.token_id) for e in core.client_events()] == [(0, 7), (1, 8)]


def test_a_first_token_that_ends_the_request_waits_for_the_decode_engine(core: _Core) -> None:
    de_task, _ = _submit(core, "one", max_tokens=1)
    _prefill_done(core, de_task.request_id, 7, now=2.0)
    assert core.client_events() == []  # the DE's last event comes after its persists
    _submit(core, "eos", max_tokens=5)
    _prefill_done(core, "eos", 99, now=2.0)  # the EOS token (ignore_eos is off)
    assert core.client_events() == []
    de = core.state.requests["one"].de
    _de_tokens(core, de, "one", [(0, 7)], last="length")
    (last,) = core.client_events()
    assert last.token_id == 7 and last.finish_reason == "length"


def test_a_request_resumes_from_its_tokens_when_its_decode_engine_dies(core: _Core) -> None:
    de_task, _ = _submit(core, "r", max_tokens=10, ignore_eos=True)
    de = core.state.requests["r"].de
    _prefill_done(core, "r", 50, now=2.0)
    _de_tokens(core, de, "r", [(0, 50), (1, 51), (2, 52)])
    assert [e.index for e in core.client_events()] == [0, 1, 2]
    core.engine_died(de, f"decode engine {de} exited")
    assert [i for i, _ in core.take(Cancel)] == [_ident(PE)]  # (not the lost DE)
    core.tick(5.0)
    ((_, task),) = core.take(DecodeTask)
    ((_, ptask),) = core.take(PrefillTask)
    other = DE_B if de == DE_A else DE_A
    assert isinstance(task, DecodeTask) and isinstance(ptask, PrefillTask)
    assert core.state.requests["r"].de == other and task.request_id == "r#1"
    assert task.prompt_token_ids == list(range(1, 41)) + [50, 51, 52]
    assert task.num_generated == ptask.num_generated == 3
    assert core.state.requests["r"].info.gen_len == 7
    _de_tokens(core, de, "r", [(3, 53)])  # a straggler of the lost attempt: dropped
    _prefill_done(core, "r#1", 53, now=6.0)  # the new attempt's PE samples token 3
    _de_tokens(core, other, "r#1", [(3, 53), (4, 54)])
    assert [(e.index, e.token_id) for e in core.client_events()] == [(3, 53), (4, 54)]


def test_a_client_ending_a_request_is_counted_cancelled_or_finished(core: _Core) -> None:
    _submit(core, "gone", max_tokens=10)
    _submit(core, "stop", max_tokens=10)
    _prefill_done(core, "stop", 5, now=2.0)
    core.handle(CLIENT, encode(Abort(request_id="gone")), 3.0)
    core.handle(CLIENT, encode(Abort(request_id="stop", reason="stop")), 3.0)
    core.handle(CLIENT, encode(Abort(request_id="never-submitted")), 3.0)
    m = core.report.metrics()
    assert (m.num_requests, m.num_cancelled, m.num_finished, m.num_failed) == (2, 1, 1, 0)
    assert {c.request_id for _, c in core.take(Cancel)} == {"gone", "stop"}  # type: ignore[attr-defined]

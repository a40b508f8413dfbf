"""The ledger's mutators, the shared fetch order and the recorded event traces."""

from __future__ import annotations

import dataclasses

import pytest

from dualpath.core.errors import DualpathError
from dualpath.policy import SchedulerConfig, make_scheduler
from dualpath.policy.cases.traces import record_traces
from dualpath.policy.fetch import RUNTIME_ORDER, SIM_ORDER
from dualpath.policy.ledger import DECODE, PREFILL, Ledger
from dualpath.policy.reference import ReferenceDriver
from dualpath.policy.traces import default_traces, dumps_traces, play, replay_traces
from dualpath.policy.views import RequestInfo


def _ledger() -> Ledger:
    led = Ledger()
    led.add_engines([(0, 0, PREFILL, 0), (2, 1, DECODE, 1000), (3, 1, DECODE, 1000), (4, 2, DECODE, 1000)])
    return led


def _info(rid: str, n: int = 100) -> RequestInfo:
    return RequestInfo(request_id=rid, cached_len=64, new_len=n, gen_len=10)


def test_recorder_reproduces_the_recorded_traces() -> None:
    assert dumps_traces(record_traces()) == dumps_traces(default_traces())


def test_reference_driver_replays_the_traces() -> None:
    def make(trace):
        return ReferenceDriver(
            make_scheduler(trace.policy, trace.config),
            num_pe_groups=trace.num_pe_groups,
            num_de_groups=trace.num_de_groups,
            engines_per_group=trace.engines_per_group,
            de_hbm_tokens=trace.de_hbm_tokens,
            read_tokens_per_s=trace.read_tokens_per_s,
            order=trace.order,
            bounds=trace.bounds,
        )

    assert replay_traces(make) == []


def test_a_driver_with_another_fetch_order_is_caught() -> None:
    trace = next(t for t in default_traces() if t.order == SIM_ORDER and t.policy == "dualpath")
    other = dataclasses.replace(trace, order=RUNTIME_ORDER)

    def make(t):
        return ReferenceDriver(
            make_scheduler(t.policy, t.config),
            num_pe_groups=2,
            num_de_groups=3,
            engines_per_group=2,
            de_hbm_tokens=9_000,
            read_tokens_per_s=1000.0,
            order=t.order,
            bounds=t.bounds,
        )

    assert replay_traces(make, (trace,)) == []
    got = play(make(other), other.events)
    assert [(k, n) for k, n, _p in got] != [(p.kind, p.node_id) for p in trace.plans]


def test_traces_lose_engines_and_keep_scheduling() -> None:
    for trace in default_traces():
        kinds = [e.kind for e in trace.events]
        last_loss = max(i for i, k in enumerate(kinds) if k == "engine_lost")
        assert kinds.count("engine_lost") == 4 and "tick" in kinds[last_loss:]


def test_apply_checks_the_queue_head() -> None:
    led = _ledger()
    led.arrive(_info("a"))
    plan = make_scheduler("dualpath").assign_decode(led.decode_view(1, 0.0))
    led.arrive(_info("b"))  # the plan no longer covers the whole global queue
    with pytest.raises(DualpathError, match="routings"):
        led.apply(1, plan)


def test_requeue_and_engine_loss_return_work_to_the_global_queue_head() -> None:
    led = _ledger()
    sched = make_scheduler("basic", SchedulerConfig())
    for rid in "abc":
        led.arrive(_info(rid))
    plan = sched.assign_decode(led.decode_view(1, 0.0))
    led.apply(1, plan)
    on_1 = [e.info.request_id for e in led.private[1]]
    led.arrive(_info("d"))
    for eid in (2, 3):  # group 1 loses both DEs: its private queue goes back, ahead of "d"
        led.on_engine_lost(eid)
    assert 1 not in led.de_nodes and 1 not in led.private
    assert [e.info.request_id for e in led.global_queue][: len(on_1)] == on_1
    assert [e.info.request_id for e in led.global_queue][-1] == "d"
    led.on_finished("d", requeue=True)
    assert led.global_queue[0].info.request_id == "d"
    for rid in list(led.requests):
        led.on_finished(rid)
    assert not led.requests and not led.global_queue
    assert all(e.num_seqs == e.num_tokens == e.reserved_tokens == 0 for e in led.engines.values())
    assert set(led.private_tokens.values()) == {0} and set(led.read_q.values()) == {0}


def test_loads_follow_plans_and_completions() -> None:
    led = _ledger()
    sched = make_scheduler("dualpath", SchedulerConfig())
    led.arrive(_info("a"))
    led.apply(1, sched.assign_decode(led.decode_view(1, 0.0)))  # routed to group 1 (first)
    (entry,) = led.prefill_queue
    de = led.engines[entry.de]
    assert (de.num_seqs, de.num_tokens, de.reserved_tokens) == (1, 174, 174)
    assert sorted(led.free_hbm(1)) == [826, 1000]
    assert led.decode_view(1, 0.0).group_totals[0].num_tokens == 174
    led.apply(0, sched.assign_prefill(led.prefill_view(0, 0.0)))
    assert led.engines[0].num_tokens == 164 and sum(led.read_q.values()) == 64
    led.on_read_done("a")
    assert sum(led.read_q.values()) == 0
    led.on_prefill_done("a")
    led.on_prefill_done("a")  # once only
    assert led.engines[0].num_tokens == 0 and led.pe_tokens(0) == [0]
    led.on_finished("a")
    assert de.num_tokens == 0 and led.on_finished("a") is None

"""The scheduler service's own event handling (``SchedulerCore``: messages in, messages out)
replays the policy's recorded event traces to the same plans as the reference and sim drivers."""

from __future__ import annotations

from dualpath.policy import SchedulerConfig, make_scheduler
from dualpath.policy import views as pv
from dualpath.policy.fetch import RUNTIME_ORDER, SIM_ORDER
from dualpath.policy.traces import default_traces, play, replay_traces
from dualpath.runtime.cluster.adapter import RuntimeTraceDriver
from dualpath.runtime.cluster.messages import Cancel, Tokens
from dualpath.runtime.cluster.state import ClusterState, EngineState


def test_scheduler_service_replays_the_recorded_traces() -> None:
    mismatches = replay_traces(RuntimeTraceDriver)
    assert mismatches == [], mismatches[:1]
    assert {t.order.rotate_pe for t in default_traces()} == {True, False}  # both fetch orders


def test_traces_go_through_dispatch_recovery_and_the_codec() -> None:
    """Every placed request was dispatched to its planned engines with the plan's read split; no
    message was dropped as invalid; the losses requeued (new attempt keys, cancels to the other
    engine) and, lost twice, failed requests to their client (policy.recovery's rule)."""
    retried = failed = cancels = 0
    for trace in default_traces():
        driver = RuntimeTraceDriver(trace)
        play(driver, trace.events)
        core = driver.core
        assert driver.dispatch_errors == [], (trace.name, driver.dispatch_errors[:3])
        assert core.drops.snapshot() == {}, (trace.name, core.drops.snapshot())
        assert core.state.requests.keys() <= core.current.keys()
        retried += core.supervision.retried
        errors = [m for _i, m in core.sent if isinstance(m, Tokens) and m.events[0].finish_reason == "error"]
        failed += len(errors)
        cancels += sum(isinstance(m, Cancel) for _i, m in core.sent)
        assert core.report.counts["num_failed"] == len(errors)
    assert retried > 0 and failed > 0 and cancels > 0


def test_a_service_that_fetches_in_another_order_fails_the_traces() -> None:
    """The traces see the service's calling order: the same core in the other fetch order diverges."""

    def other_order(trace):
        driver = RuntimeTraceDriver(trace)
        driver.core.state.order = SIM_ORDER if trace.order == RUNTIME_ORDER else RUNTIME_ORDER
        return driver

    assert len(replay_traces(other_order)) == len(default_traces())


def test_state_keeps_loads_in_the_ledger_and_releases_them() -> None:
    st = ClusterState()
    for eid, node in ((1, 1), (2, 2)):
        st.add_engine(EngineState(engine_id=eid, role="decode", node_id=node, hbm_tokens=1000))
    st.add_engine(EngineState(engine_id=0, role="prefill", node_id=0))
    st.submit(pv.RequestInfo(request_id="a", cached_len=128, new_len=10, gen_len=5))
    sched = make_scheduler("dualpath", SchedulerConfig())
    assert st.fetch(sched, 0.0) == ["a"]  # DE and PE in one round (decode groups fetch first)
    entry = st.requests["a"]
    loads = st.ledger.engines
    assert loads[entry.de].reserved_tokens == 143 and loads[0].num_tokens == 138
    assert entry.assignment is not None and entry.assignment.engine_id == 0
    assert sum(st.ledger.read_q.values()) == 128
    st.finish("a")
    assert sum(st.ledger.read_q.values()) == 0
    assert loads[entry.de].reserved_tokens == 0 and loads[0].num_tokens == 0

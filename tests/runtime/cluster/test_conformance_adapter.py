"""The scheduler service's state (runtime driver) replays the policy's recorded event traces."""

from __future__ import annotations

from dualpath.policy import SchedulerConfig, make_scheduler
from dualpath.policy import views as pv
from dualpath.policy.traces import default_traces, replay_traces
from dualpath.runtime.cluster.adapter import RuntimeTraceDriver
from dualpath.runtime.cluster.state import ClusterState, EngineState


def test_runtime_state_replays_the_recorded_traces() -> None:
    mismatches = replay_traces(RuntimeTraceDriver)
    assert mismatches == [], mismatches[:1]
    assert {t.order.rotate_pe for t in default_traces()} == {True, False}  # both fetch orders


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

"""The scheduler service's state (runtime driver) replays the policy conformance cases."""

from __future__ import annotations

from dualpath.policy import make_scheduler
from dualpath.policy import views as pv
from dualpath.policy.conformance import replay
from dualpath.runtime.cluster.adapter import RuntimeAdapter


def test_runtime_adapter_conforms() -> None:
    mismatches = replay(RuntimeAdapter())
    assert mismatches == [], mismatches[:2]


def test_state_rebuilds_a_decode_view_from_its_own_bookkeeping() -> None:
    from dualpath.runtime.cluster.state import ClusterState, EngineState

    st = ClusterState()
    for eid, node in ((1, 1), (2, 2)):
        st.add_engine(EngineState(engine_id=eid, role="decode", node_id=node, hbm_tokens=1000))
    st.add_engine(EngineState(engine_id=0, role="prefill", node_id=0))
    st.submit(pv.RequestInfo(request_id="a", cached_len=128, new_len=10, gen_len=5))
    sched = make_scheduler("dualpath", __import__("dualpath.policy", fromlist=["x"]).SchedulerConfig())
    got = st.apply_decode(1, sched.assign_decode(st.decode_view(1, 0.0)))
    routed = st.private_queues[2]
    assert got == ["a"] or routed == ["a"]
    if got:
        assert st.engines[1].reserved_tokens == 143
        plan = sched.assign_prefill(st.prefill_view(0, 0.0))
        assert st.apply_prefill(0, plan) == ["a"]
        assert sum(st.read_q.values()) == 128
        st.finish("a")
        assert sum(st.read_q.values()) == 0
        assert st.engines[1].reserved_tokens == 0 and st.engines[0].num_tokens == 0

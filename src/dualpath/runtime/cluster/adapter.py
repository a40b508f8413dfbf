"""The runtime's TraceDriver for ``dualpath.policy.traces.replay_traces``.

The trace's events go to the scheduler service's own :class:`ClusterState` (the same calls
``SchedulerService`` makes: submit, the tick's fetch round, Progress read_done / prefill_done, the
last token's finish, ``engine_died``'s requeue-then-drop) and its applied plans are recorded.
"""

from __future__ import annotations

from dualpath.policy import make_scheduler
from dualpath.policy import views as pv
from dualpath.policy.traces import Trace
from dualpath.runtime.cluster.state import ClusterState, EngineState


class RuntimeTraceDriver:
    """``make_driver`` for ``replay_traces``: ``RuntimeTraceDriver(trace)``."""

    def __init__(self, trace: Trace) -> None:
        self.sched = make_scheduler(trace.policy, trace.config)
        self.state = st = ClusterState(read_tokens_per_s=trace.read_tokens_per_s, order=trace.order)
        st.ledger.bounds = trace.bounds
        for eid, node, role in trace.engines():
            st.add_engine(
                EngineState(
                    engine_id=eid,
                    role="decode" if role == "de" else "prefill",
                    node_id=node,
                    hbm_tokens=trace.de_hbm_tokens if role == "de" else 0,
                )
            )
        st.log = []
        self.dispatched: list[str] = []

    def arrive(self, request: pv.RequestInfo) -> None:
        self.state.submit(request)

    def tick(self, now_s: float) -> None:
        self.dispatched.extend(self.state.fetch(self.sched, now_s))

    def read_done(self, request_id: str, node_id: int) -> None:
        self.state.read_done(request_id, node_id)

    def prefill_done(self, request_id: str) -> None:
        self.state.prefill_done(request_id)

    def finished(self, request_id: str) -> None:
        self.state.finish(request_id)

    def engine_lost(self, engine_id: int) -> None:
        self.state.engines[engine_id].alive = False
        for rid in self.state.ledger.requests_on(engine_id):
            self.state.requeue(rid)
        self.state.engine_lost(engine_id)

    def plans(self) -> list:
        assert self.state.log is not None
        return self.state.log

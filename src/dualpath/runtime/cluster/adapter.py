"""Conformance adapter: recorded policy views -> ClusterState -> views rebuilt by the service's code.

Used by tests (policy conformance harness). For a decode view the fetching group's engines and
private queue become real state; every other DE group gets one stand-in engine carrying its recorded
total (the service only exposes totals of other groups to the policy).
"""

from __future__ import annotations

from dualpath.core.errors import DualpathError
from dualpath.policy import make_scheduler
from dualpath.policy import views as pv
from dualpath.policy.config import SchedulerConfig
from dualpath.runtime.cluster.state import ClusterState, EngineState, ReqState


class RuntimeAdapter:
    """Implements dualpath.policy.conformance.ConformanceAdapter for the runtime scheduler."""

    def run_step(self, *, policy: str, config: SchedulerConfig, kind: str, view: object) -> object:
        sched = make_scheduler(policy, config)
        if kind == "decode" and isinstance(view, pv.DecodeFetchView):
            st, node = _decode_state(view), view.group.group_id
            return sched.assign_decode(st.decode_view(node, view.now_s))
        if kind == "prefill" and isinstance(view, pv.PrefillFetchView):
            st, node = _prefill_state(view)
            return sched.assign_prefill(st.prefill_view(node, view.now_s))
        if kind == "batch" and isinstance(view, pv.BatchView):
            from dualpath.runtime.cluster.batching import PrefillQueue

            q = PrefillQueue(view.engine_id)
            for it in view.waiting:
                q.add(it.request_id, it.cached_len, it.new_len)
            return sched.plan_prefill_batch(q.view(view.now_s))
        raise DualpathError(f"step kind {kind!r} does not match view {type(view).__name__}")


def _engine(load: pv.EngineLoad, role: str, node: int) -> EngineState:
    return EngineState(engine_id=load.engine_id, role=role, node_id=node,
                       hbm_tokens=load.free_hbm_tokens, num_seqs=load.num_seqs,
                       num_tokens=load.num_tokens)


def _decode_state(view: pv.DecodeFetchView) -> ClusterState:
    st = ClusterState()
    node = view.group.group_id
    for load in view.group.engines:
        st.add_engine(_engine(load, "decode", node))
    fake_id = max([e.engine_id for e in view.group.engines] + [0]) + 1000
    for tot in view.group_totals:
        if tot.group_id != node:
            fake_id += 1
            st.add_engine(EngineState(engine_id=fake_id, role="decode", node_id=tot.group_id,
                                      num_tokens=tot.num_tokens))
    for info in view.private_queue:
        st.requests[info.request_id] = ReqState(info=info)
        st.private_queues[node].append(info.request_id)
    for info in view.global_queue:
        st.submit(info)
    st.de_rr[node] = view.rr_cursor
    st.group_rr = view.group_rr_cursor
    return st


def _prefill_state(view: pv.PrefillFetchView) -> tuple[ClusterState, int]:
    if len(view.groups) != 1:
        raise DualpathError("the runtime fetches one PE group at a time (strict leader fetch)")
    group = view.groups[0]
    st = ClusterState()
    for load in group.engines:
        st.add_engine(_engine(load, "prefill", group.node_id))
    for q in view.read_queues:
        st.read_q[q.node_id] = q.read_queue_tokens
        st.read_rate[q.node_id] = q.read_tokens_per_s
    for p in view.queue:
        if p.de_engine_id not in st.engines:
            st.add_engine(EngineState(engine_id=p.de_engine_id, role="decode", node_id=p.de_node_id))
        st.requests[p.request.request_id] = ReqState(info=p.request, de=p.de_engine_id)
        st.prefill_queue.append(p.request.request_id)
    st.pe_rr[group.node_id] = view.rr_cursor
    return st, group.node_id

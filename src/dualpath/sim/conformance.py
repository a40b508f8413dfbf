"""The simulator's ConformanceAdapter for ``dualpath.policy.conformance.replay``.

From a recorded view it sets up the state the simulator's :class:`PolicyAdapter` reads (engine
loads, queues of simulated requests, node read queues), lets the adapter build the view with its
own code, calls the scheduler, and applies the plan to that state (so a plan the simulator could
not execute fails here too). The recorded view is never passed through.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from dualpath.policy import views as v
from dualpath.policy.scheduler import make_scheduler
from dualpath.sim.adapter import PolicyAdapter


class _Req:
    """Just the fields of ``sim.request.Req`` the adapter reads."""

    def __init__(self, info: v.RequestInfo, de_gpu: int = -1) -> None:
        self.rid = info.request_id
        self.info = info
        self.decode_len = info.decode_len
        self.prompt_len = info.prompt_len
        self.hit_len = info.cached_len
        self.miss_len = info.new_len
        self.done_new = 0
        self.de_gpu = de_gpu
        self.is_ready = True
        self.out_claimed = True
        self.pending: v.PendingPrefill | None = None


class _FakeSim:
    """Simulator state rebuilt from one view: nodes, engines, queues. Records executed plans."""

    def __init__(self, now_s: float, de_groups=(), pe_groups=(), read_queues=()) -> None:
        self.kernel = SimpleNamespace(now_s=now_s)
        self.bpt = 1
        self.load = self  # the adapter asks sim.load: a layerwise path with room for all output
        self.whole_prompt_in_hbm = False
        self.starved_units: set = set()
        ids = sorted({g.node_id for g in (*de_groups, *pe_groups)}
                     | {q.node_id for q in read_queues})
        rates = {q.node_id: q.read_tokens_per_s for q in read_queues}
        reads = {q.node_id: q.read_queue_tokens for q in read_queues}
        by_id = {n: SimpleNamespace(node_id=n, gpus=[], read_q=reads.get(n, 0),
                                    snic=SimpleNamespace(bytes_per_s=rates.get(n, 1.0)))
                 for n in ids}
        self.de_states: dict[int, SimpleNamespace] = {}
        self.pe_states: dict[int, SimpleNamespace] = {}
        for group in de_groups:
            by_id[group.node_id].gpus = [e.engine_id for e in group.engines]
            for e in group.engines:
                self.de_states[e.engine_id] = SimpleNamespace(
                    seq=e.num_seqs, tok=e.num_tokens, hbm_tokens=e.free_hbm_tokens, reserved=0,
                    node_id=group.node_id)
        for group in pe_groups:
            by_id[group.node_id].gpus = [e.engine_id for e in group.engines]
            for e in group.engines:
                self.pe_states[e.engine_id] = SimpleNamespace(
                    seq=e.num_seqs, tok=e.num_tokens, gpu_id=e.engine_id, queue=[], unit=None)
        # node list indexed by node id (the adapter indexes cluster.nodes[node_id])
        nodes = [by_id.get(i, SimpleNamespace(node_id=i, gpus=[], read_q=0,
                                              snic=SimpleNamespace(bytes_per_s=1.0)))
                 for i in range(max(ids) + 1 if ids else 0)]
        pe_ids = {g.node_id for g in pe_groups}
        de_nodes = [by_id[g.node_id] for g in de_groups] or [
            by_id[n] for n in ids if n not in pe_ids]  # prefill views: DE nodes by read queue
        self.cluster = SimpleNamespace(nodes=nodes, de_nodes=de_nodes,
                                       pe_nodes=[by_id[g.node_id] for g in pe_groups])
        self.de_node_tok = {n.node_id: 0 for n in de_nodes}
        self.assigned: list = []

    def mark_de_dirty(self, node_id: int) -> None:
        pass

    def assign_de(self, req, gpu_id: int) -> None:
        self.assigned.append((req.rid, gpu_id))

    def assign_pe(self, req, gpu_id, pe_read_len, de_read_len, side) -> None:
        assert pe_read_len + de_read_len == req.hit_len
        self.assigned.append((req.rid, gpu_id, side))

    def claim_output(self, req) -> bool:
        return True

    def unclaim_output(self, req) -> None:
        pass


class SimConformanceAdapter:
    """``run_step`` for ``dualpath.policy.conformance.replay``."""

    def run_step(self, *, policy, config, kind, view):
        sched = make_scheduler(policy, config)
        if kind == "decode":
            return self._decode(sched, view)
        if kind == "prefill":
            return self._prefill(sched, view)
        return self._batch(sched, view)

    def _decode(self, sched, view: v.DecodeFetchView):
        totals = {t.group_id: t.num_tokens for t in view.group_totals}
        groups = [view.group if t.group_id == view.group.group_id else
                  v.GroupLoad(group_id=t.group_id, node_id=t.group_id, engines=())
                  for t in view.group_totals]
        sim: Any = _FakeSim(view.now_s, de_groups=groups)
        adapter: Any = PolicyAdapter(sim, sched)
        for g in groups:  # other groups' totals: engine tokens folded into private-queue tokens
            sim.de_node_tok[g.node_id] = sum(e.num_tokens for e in g.engines)
            adapter.private_tokens[g.node_id] = totals[g.group_id] - sim.de_node_tok[g.node_id]
        adapter.private[view.group.node_id].extend(_Req(r) for r in view.private_queue)
        adapter.global_queue.extend(_Req(r) for r in view.global_queue)
        adapter.de_rr[view.group.node_id] = view.rr_cursor
        adapter.group_rr = view.group_rr_cursor
        node = sim.cluster.nodes[view.group.node_id]
        plan = sched.assign_decode(adapter.decode_view(node))
        adapter.apply_decode(node, plan)
        return plan

    def _prefill(self, sched, view: v.PrefillFetchView):
        sim: Any = _FakeSim(view.now_s, pe_groups=view.groups, read_queues=view.read_queues)
        adapter: Any = PolicyAdapter(sim, sched)
        for p in view.queue:
            req = _Req(p.request, p.de_engine_id)
            req.pending = v.PendingPrefill(request=req.info, de_engine_id=p.de_engine_id,
                                           de_node_id=p.de_node_id)
            adapter.prefill_queue.append(req)
        group = view.groups[0]
        adapter.pe_rr[group.node_id] = view.rr_cursor
        node = sim.cluster.nodes[group.node_id]
        plan = sched.assign_prefill(adapter.prefill_view(node))
        adapter.apply_prefill(node, plan)
        return plan

    def _batch(self, sched, view: v.BatchView):
        sim: Any = _FakeSim(view.now_s)
        adapter: Any = PolicyAdapter(sim, sched)
        st = SimpleNamespace(gpu_id=view.engine_id, queue=[], unit=None)
        for item in view.waiting:
            st.queue.append(_Req(v.RequestInfo(request_id=item.request_id,
                                               cached_len=item.cached_len, new_len=item.new_len)))
        ready, claimed, built = adapter.batch_view(st)
        plan = sched.plan_prefill_batch(built)
        adapter.apply_batch(ready, claimed, plan)
        return plan

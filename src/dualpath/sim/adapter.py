"""The simulator's adapter to ``dualpath.policy``: build views from sim state, execute plans.

This is the ONLY place the simulator meets scheduling decisions; it decides nothing itself. Group
ids are node ids (one group per node, spec section 3); engine ids are GPU ids. Queue prefixes passed
in a view are bounded (``VIEW_LIMIT``): PE choice is FIFO and stops at the first request it cannot
place, so a plan for a prefix equals the whole-queue plan cut there; when a plan takes the whole
prefix the driver fetches again at once with the updated loads (tested equal to unbounded views).
"""

from __future__ import annotations

from collections import defaultdict, deque
from itertools import islice
from typing import TYPE_CHECKING, Final

from dualpath.policy.views import (
    BatchItem,
    BatchPlan,
    BatchView,
    DecodeFetchView,
    DecodePlan,
    EngineLoad,
    GroupLoad,
    GroupTotal,
    NodeReadQueue,
    PendingPrefill,
    PrefillFetchView,
    PrefillPlan,
    RequestInfo,
)

if TYPE_CHECKING:
    from dualpath.policy.scheduler import PolicyScheduler
    from dualpath.sim.cluster import Node
    from dualpath.sim.driver import Simulation
    from dualpath.sim.prefill import PeState
    from dualpath.sim.request import Req

VIEW_LIMIT = 64
# Fetch elision: skip a fetch whose plan is provably empty -- a DE group whose private-queue head
# fits no DE (every DE choice ends its fetch there) with an empty global queue, or a PE group whose
# engines are all over beta (class C1, never chosen by any PE choice). Cursors are unchanged in both
# cases, so plans are identical with and without it (tests/sim check the JCT is the same).
FETCH_ELISION = True
SMALL_CLUSTER_NODES: Final = 32
# Private-queue prefixes: every DE choice assigns a prefix of the private queue whose tokens fit
# the group's free HBM (it stops at the first request no DE has room for, and the assigned tokens
# never exceed the group's free total); balanced's R is that same fitting prefix. So a DE view
# needs the private queue only up to the first request that takes its running sum past the
# group's free HBM: the plan is the same (tests/sim check the JCT is the same without the bound).
BOUND_PRIVATE_VIEW = True
_PRIVATE_FULL = 8  # queues up to this long are passed whole (the scan would cost more)
BATCH_VIEW_LIMIT: Final = 64


class PolicyAdapter:
    def __init__(self, sim: Simulation, scheduler: PolicyScheduler) -> None:
        self.sim = sim
        self.scheduler = scheduler
        self._beta: int = scheduler.config.beta_tokens  # (the scheduler is frozen)
        self.global_queue: deque[Req] = deque()
        self.private: dict[int, deque[Req]] = {n.node_id: deque() for n in sim.cluster.de_nodes}
        self.private_tokens: dict[int, int] = {n.node_id: 0 for n in sim.cluster.de_nodes}
        self.prefill_queue: deque[Req] = deque()
        self.de_rr: dict[int, int] = {n.node_id: 0 for n in sim.cluster.de_nodes}
        self.pe_rr: dict[int, int] = {n.node_id: 0 for n in sim.cluster.pe_nodes}
        self.group_rr = 0
        self.read_rate: dict[int, float] = {n.node_id: n.snic.bytes_per_s / sim.bpt
                                            for n in sim.cluster.nodes}
        self.fetches = 0
        self.de_node_ids = [n.node_id for n in sim.cluster.de_nodes]
        self.all_node_ids = [n.node_id for n in (*sim.cluster.pe_nodes, *sim.cluster.de_nodes)]
        self._all_sorted = sorted(self.all_node_ids)
        # View caches. The driver calls de_changed / pe_changed whenever a DE's or PE's numbers
        # (seq, tok, reservation) change; the adapter itself tracks its private-queue tokens.
        self._groups: dict[int, GroupLoad] = {}  # node id -> GroupLoad (DE and PE nodes)
        self._totals_list: list[GroupTotal | None] = [None] * len(self.de_node_ids)
        self._totals_pos = {n: i for i, n in enumerate(self.de_node_ids)}
        self._totals_dirty: set[int] = set(self.de_node_ids)  # nodes whose total may have changed
        self._totals_tuple: tuple[GroupTotal, ...] = ()
        self._reads: dict[int, NodeReadQueue] = {}

        self._node_loads: dict[int, list[EngineLoad]] = {}  # node id -> its engines' loads
        self._rank = {g: i for n in sim.cluster.nodes for i, g in enumerate(n.gpus)}  # GPU -> rank
        # node id -> GPUs whose EngineLoad is out of date
        self._stale: defaultdict[int, set[int]] = defaultdict(set)

    def de_changed(self, node_id: int, gpu_id: int) -> None:
        """DE ``gpu_id`` of node ``node_id`` changed seq/tok/reservation (its group total too)."""
        self._groups.pop(node_id, None)
        self._stale[node_id].add(gpu_id)
        self._totals_dirty.add(node_id)

    def pe_changed(self, node_id: int, gpu_id: int) -> None:
        """PE ``gpu_id`` of node ``node_id`` changed seq/tok."""
        self._groups.pop(node_id, None)
        self._stale[node_id].add(gpu_id)

    def _group(self, node: Node, de: bool) -> GroupLoad:
        """The node's GroupLoad; only the EngineLoads of GPUs that changed are rebuilt (DE loads
        when ``de``, else PE loads)."""
        nid = node.node_id
        group = self._groups.get(nid)
        if group is not None:
            return group
        loads = self._node_loads.get(nid)
        stale = self._stale.pop(nid, None)
        if loads is None:
            loads = [self._de_load(g) if de else self._pe_load(g) for g in node.gpus]
            self._node_loads[nid] = loads
        elif stale:
            rank = self._rank
            for g in stale:
                loads[rank[g]] = self._de_load(g) if de else self._pe_load(g)
        group = GroupLoad(group_id=nid, node_id=nid, engines=tuple(loads))
        self._groups[nid] = group
        return group

    def _de_load(self, g: int) -> EngineLoad:
        st = self.sim.de_states[g]
        return EngineLoad(engine_id=g, num_seqs=st.seq, num_tokens=st.tok,
                          free_hbm_tokens=st.hbm_tokens - st.reserved)

    def _pe_load(self, g: int) -> EngineLoad:
        st = self.sim.pe_states[g]
        return EngineLoad(engine_id=g, num_seqs=st.seq, num_tokens=st.tok, free_hbm_tokens=0)

    # ------------------------------------------------------------------ decode side
    def _de_group(self, node: Node) -> GroupLoad:
        return self._group(node, True)

    def fetch_decode(self, node: Node) -> int:
        """One DE group's fetch. Returns the number of requests assigned to its DEs."""
        plan = self.scheduler.assign_decode(self.decode_view(node))
        self.fetches += 1
        return self.apply_decode(node, plan)

    def decode_may_assign(self, node: Node) -> bool:
        """False only if this DE group's fetch would certainly return an empty plan."""
        if not FETCH_ELISION or self.global_queue:
            return True
        queue = self.private[node.node_id]
        if not queue:
            return False
        need = queue[0].decode_len
        states = self.sim.de_states
        for g in node.gpus:
            st = states[g]
            if st.hbm_tokens - st.reserved >= need:
                return True
        return False

    def prefill_may_assign(self, node: Node) -> bool:
        """False only if every PE of this group is over beta (C1)."""
        if not FETCH_ELISION:
            return True
        beta = self._beta
        pes = self.sim.pe_states
        for g in node.gpus:
            if pes[g].tok <= beta:
                return True
        return False

    def decode_view(self, node: Node) -> DecodeFetchView:
        sim = self.sim
        dirty = self._totals_dirty
        if dirty:  # frozen GroupTotal objects, rebuilt only for nodes whose total changed
            node_tok = sim.de_node_tok
            private_tokens = self.private_tokens
            out = self._totals_list
            pos = self._totals_pos
            for n in dirty:
                value = node_tok[n] + private_tokens[n]
                obj = out[pos[n]]
                if obj is None or obj.num_tokens != value:
                    out[pos[n]] = GroupTotal(group_id=n, num_tokens=value)
            dirty.clear()
            self._totals_tuple = tuple(out)  # type: ignore[arg-type]
        totals = self._totals_tuple
        group = self._de_group(node)
        view = DecodeFetchView(
            now_s=sim.kernel.now_s, group=group,
            private_queue=self._private_prefix(self.private[node.node_id], group),
            global_queue=_infos(self.global_queue), group_totals=totals,
            rr_cursor=self.de_rr[node.node_id], group_rr_cursor=self.group_rr)
        return view

    def _private_prefix(self, queue: deque[Req], group: GroupLoad) -> tuple[RequestInfo, ...]:
        """The private queue's infos up to the first request past the group's free HBM (see
        BOUND_PRIVATE_VIEW); the whole queue when it is short or never gets past it."""
        if not BOUND_PRIVATE_VIEW or len(queue) <= _PRIVATE_FULL:
            return _infos(queue)
        room = 0
        for engine in group.engines:
            room += engine.free_hbm_tokens
        out: list[RequestInfo] = []
        total = 0
        for req in queue:
            out.append(req.info)
            total += req.decode_len
            if total > room:
                break
        return tuple(out)

    def apply_decode(self, node: Node, plan: DecodePlan) -> int:
        """Carry out a DecodePlan: route the global queue, assign DEs (reserving HBM)."""
        sim = self.sim
        self.de_rr[node.node_id] = plan.next_rr_cursor
        self.group_rr = plan.next_group_rr_cursor
        dirty = self._totals_dirty  # private-queue tokens change below
        if plan.routings:
            assert len(plan.routings) == len(self.global_queue), "routing must drain the queue"
            for routing in plan.routings:
                req = self.global_queue.popleft()
                assert req.rid == routing.request_id, (req.rid, routing.request_id)
                gid = routing.group_id
                self.private[gid].append(req)
                self.private_tokens[gid] = self.private_tokens[gid] + req.decode_len
                dirty.add(gid)
                sim.mark_de_dirty(gid)
        queue = self.private[node.node_id]
        if plan.assignments:
            dirty.add(node.node_id)
        for assignment in plan.assignments:
            req = queue.popleft()
            assert req.rid == assignment.request_id, (req.rid, assignment.request_id)
            self.private_tokens[node.node_id] = self.private_tokens[node.node_id] - req.decode_len
            sim.assign_de(req, assignment.engine_id)
        return len(plan.assignments)

    # ------------------------------------------------------------------ prefill side
    def fetch_prefill(self, node: Node) -> int:
        """One PE group's fetch (strict leader fetch: this group only)."""
        plan = self.scheduler.assign_prefill(self.prefill_view(node))
        self.fetches += 1
        return self.apply_prefill(node, plan)

    def prefill_view(self, node: Node) -> PrefillFetchView:
        sim = self.sim
        group = self._group(node, False)
        nodes = sim.cluster.nodes
        small = len(nodes) <= SMALL_CLUSTER_NODES  # small clusters: every node's read queue
        prefix: list[PendingPrefill] = []
        if small:
            for req in islice(self.prefill_queue, VIEW_LIMIT):
                prefix.append(_pending(req))
            node_ids = self._all_sorted
        else:
            nodes_seen = {node.node_id}
            for req in islice(self.prefill_queue, VIEW_LIMIT):
                pending = _pending(req)
                prefix.append(pending)
                nodes_seen.add(pending.de_node_id)
            node_ids = sorted(nodes_seen)
        reads = self._reads  # frozen NodeReadQueue objects, rebuilt only when read_q changed
        out: list[NodeReadQueue] = []
        for n in node_ids:
            q = nodes[n].read_q
            obj = reads.get(n)
            if obj is None or obj.read_queue_tokens != q:
                obj = NodeReadQueue(node_id=n, read_queue_tokens=q,
                                    read_tokens_per_s=self.read_rate[n])
                reads[n] = obj
            out.append(obj)
        queues = tuple(out)
        return PrefillFetchView(now_s=sim.kernel.now_s, groups=(group,), queue=tuple(prefix),
                                read_queues=queues, rr_cursor=self.pe_rr[node.node_id])

    def apply_prefill(self, node: Node, plan: PrefillPlan) -> int:
        """Carry out a PrefillPlan: pop the assigned prefix, start its reads."""
        sim = self.sim
        self.pe_rr[node.node_id] = plan.next_rr_cursor
        for a in plan.assignments:
            req = self.prefill_queue.popleft()
            assert req.rid == a.request_id, (req.rid, a.request_id)
            sim.assign_pe(req, a.engine_id, a.pe_read_len, a.de_read_len, a.read_side)
        return len(plan.assignments)

    def enqueue_prefill(self, req: Req, de_node_id: int) -> None:
        req.pending = PendingPrefill(request=req.info, de_engine_id=req.de_gpu,
                                     de_node_id=de_node_id)
        self.prefill_queue.append(req)

    # ------------------------------------------------------------------ PE batch
    def plan_batch(self, st: PeState) -> list[tuple[Req, int, int]]:
        """``[(req, cached_len, chunk_len)]`` for PE ``st``'s next iteration (may be empty)."""
        ready, claimed, view = self.batch_view(st)
        if view is None:
            return []
        return self.apply_batch(ready, claimed, self.scheduler.plan_prefill_batch(view))

    def batch_view(self, st: PeState) -> tuple[list[Req], list[Req], BatchView | None]:
        """``(ready, claimed, BatchView | None)``: the PE's ready requests (reads done, DE buffer
        room taken for their output; Basic: whole prompts fitting PE HBM) in assignment order."""
        ready: list[Req] = []
        sim = self.sim
        basic = sim.load.whole_prompt_in_hbm
        room = sim.pe_kv_tokens if basic else 0
        claimed: list[Req] = []
        for req in st.queue:
            if not req.is_ready:
                continue
            if not req.out_claimed:  # ready = reads done and DE-buffer room for the output
                if not sim.load.claim_output(req):
                    sim.starved_units.add(st.unit)
                    continue
                req.out_claimed = True
                claimed.append(req)
            if basic:  # Basic: the whole prompt KV must fit in PE HBM
                if ready and req.prompt_len > room:
                    break
                room -= req.prompt_len
            ready.append(req)
            if len(ready) >= BATCH_VIEW_LIMIT:
                break
        if not ready:
            return ready, claimed, None
        items = tuple([BatchItem(request_id=r.rid, cached_len=r.hit_len + r.done_new,
                                 new_len=r.miss_len - r.done_new) for r in ready])
        return ready, claimed, BatchView(now_s=sim.kernel.now_s, engine_id=st.gpu_id,
                                         waiting=items)

    def apply_batch(self, ready: list[Req], claimed: list[Req],
                    plan: BatchPlan) -> list[tuple[Req, int, int]]:
        sim = self.sim
        out: list[tuple[Req, int, int]] = []
        for req, entry in zip(ready, plan.entries):
            assert req.rid == entry.request_id
            out.append((req, entry.cached_len, entry.chunk_len))
        picked = {id(r) for r, _c, _n in out}
        for req in claimed:  # give back room taken for requests the plan did not pick
            if id(req) not in picked:
                req.out_claimed = False
                sim.load.unclaim_output(req)
        return out


def _infos(queue: deque[Req]) -> tuple[RequestInfo, ...]:
    """The RequestInfo of every queued request, in queue order."""
    return tuple([req.info for req in queue])


def _pending(req: Req) -> PendingPrefill:
    pending = req.pending
    assert pending is not None, req.rid  # set by enqueue_prefill
    return pending

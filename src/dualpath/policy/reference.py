"""ReferenceDriver: the smallest driver that follows docs/policy.md's calling order.

It keeps the state a real driver keeps (queues, engine loads, read queues, cursors), builds views,
calls a Scheduler and applies the plans. It has no time model and no bandwidth model: reads drain
and decodes finish only when the caller says so. Used to record conformance cases, by the speed
benchmark, and as a worked example for the simulator and runtime drivers. Mutable, single-threaded.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from dualpath.core.errors import require
from dualpath.policy.scheduler import Scheduler
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

View = DecodeFetchView | PrefillFetchView | BatchView
Plan = DecodePlan | PrefillPlan | BatchPlan


@dataclass(slots=True)
class _Engine:
    engine_id: int
    num_seqs: int = 0
    num_tokens: int = 0
    free_hbm_tokens: int = 0

    def load(self) -> EngineLoad:
        return EngineLoad(engine_id=self.engine_id, num_seqs=self.num_seqs,
                          num_tokens=self.num_tokens, free_hbm_tokens=self.free_hbm_tokens)


class ReferenceDriver:
    """PE groups are nodes ``0..num_pe_groups-1``, DE groups the nodes after them; engine ids are
    ``node * engines_per_group + rank``. ``log`` collects ``(kind, view, plan)`` when recording."""

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        num_pe_groups: int,
        num_de_groups: int,
        engines_per_group: int = 8,
        de_hbm_tokens: int = 1_000_000,
        read_tokens_per_s: float = 1.0,
        record: bool = False,
    ) -> None:
        require(num_pe_groups > 0, "num_pe_groups", num_pe_groups, "must be > 0")
        require(num_de_groups > 0, "num_de_groups", num_de_groups, "must be > 0")
        require(engines_per_group > 0, "engines_per_group", engines_per_group, "must be > 0")
        self.scheduler = scheduler
        self.pe_nodes = list(range(num_pe_groups))
        self.de_nodes = list(range(num_pe_groups, num_pe_groups + num_de_groups))
        self.engines: dict[int, list[_Engine]] = {
            node: [_Engine(engine_id=node * engines_per_group + r,
                           free_hbm_tokens=de_hbm_tokens if node in self.de_nodes else 0)
                   for r in range(engines_per_group)]
            for node in self.pe_nodes + self.de_nodes
        }
        self.by_id = {e.engine_id: (n, e) for n, es in self.engines.items() for e in es}
        self.read_q = {n: 0 for n in self.pe_nodes + self.de_nodes}
        self.read_total = {n: 0 for n in self.pe_nodes + self.de_nodes}  # tokens ever read
        self.read_rate = read_tokens_per_s
        self.global_queue: list[RequestInfo] = []
        self.private: dict[int, deque[RequestInfo]] = {n: deque() for n in self.de_nodes}
        self.private_tokens = {n: 0 for n in self.de_nodes}
        self.prefill_queue: deque[PendingPrefill] = deque()
        self.waiting: dict[int, list[BatchItem]] = {}
        self.requests: dict[str, tuple[RequestInfo, int, int]] = {}  # id -> (req, de, pe)
        self.rr = {n: 0 for n in self.pe_nodes + self.de_nodes}
        self.group_rr = 0
        self.record = record
        self.log: list[tuple[str, View, Plan]] = []
        self.num_assigned = 0
        self.prefilled: deque[str] = deque()  # prefill done, decoding (finish_decode frees them)

    # ------------------------------------------------------------------ arrivals and fetches

    def arrive(self, req: RequestInfo) -> None:
        self.global_queue.append(req)

    def _group(self, node: int) -> GroupLoad:
        return GroupLoad(group_id=node, node_id=node,
                         engines=tuple(e.load() for e in self.engines[node]))

    def decode_view(self, node: int, now_s: float) -> DecodeFetchView:
        totals = tuple(
            GroupTotal(group_id=n, num_tokens=sum(e.num_tokens for e in self.engines[n])
                       + self.private_tokens[n])
            for n in self.de_nodes
        )
        return DecodeFetchView(now_s=now_s, group=self._group(node),
                               private_queue=tuple(self.private[node]),
                               global_queue=tuple(self.global_queue), group_totals=totals,
                               rr_cursor=self.rr[node], group_rr_cursor=self.group_rr)

    def de_fetch(self, node: int, now_s: float = 0.0) -> DecodePlan:
        view = self.decode_view(node, now_s)
        plan = self.scheduler.assign_decode(view)
        for req, routing in zip(view.global_queue, plan.routings, strict=True):
            self.private[routing.group_id].append(req)
            self.private_tokens[routing.group_id] += req.decode_len
        self.global_queue.clear()
        queue = self.private[node]
        for a in plan.assignments:
            req = queue.popleft()
            require(req.request_id == a.request_id, "assignment", a, "not the queue head")
            self.private_tokens[node] -= req.decode_len
            _, de = self.by_id[a.engine_id]
            de.num_seqs += 1
            de.num_tokens += req.decode_len
            de.free_hbm_tokens -= req.decode_len
            self.requests[req.request_id] = (req, a.engine_id, -1)
            self.prefill_queue.append(
                PendingPrefill(request=req, de_engine_id=a.engine_id, de_node_id=node))
        self.rr[node], self.group_rr = plan.next_rr_cursor, plan.next_group_rr_cursor
        self.num_assigned += len(plan.assignments)
        self._log("decode", view, plan)
        return plan

    def prefill_view(
        self, node: int, now_s: float, window: int | None = None, central: bool = False
    ) -> PrefillFetchView:
        queue = tuple(self.prefill_queue) if window is None else tuple(
            self.prefill_queue[i] for i in range(min(window, len(self.prefill_queue))))
        reads = tuple(NodeReadQueue(node_id=n, read_queue_tokens=q,
                                    read_tokens_per_s=self.read_rate)
                      for n, q in self.read_q.items())
        groups = tuple(self._group(n) for n in self.pe_nodes) if central else (self._group(node),)
        return PrefillFetchView(now_s=now_s, groups=groups, queue=queue,
                                read_queues=reads, rr_cursor=self.rr[node])

    def pe_fetch(
        self, node: int, now_s: float = 0.0, window: int | None = None, central: bool = False
    ) -> PrefillPlan:
        """``window`` limits how much of the prefill queue goes into the view (a driver's speed
        knob; the plan is the same whenever the fetch stops inside the window). ``central``
        offers every PE group as a candidate (central-scheduler mode), not just ``node``'s."""
        view = self.prefill_view(node, now_s, window, central)
        plan = self.scheduler.assign_prefill(view)
        for a in plan.assignments:
            pending = self.prefill_queue.popleft()
            req = pending.request
            require(req.request_id == a.request_id, "assignment", a, "not the queue head")
            pe_node, pe = self.by_id[a.engine_id]
            pe.num_seqs += 1
            pe.num_tokens += req.prompt_len
            self.read_q[pe_node] += a.pe_read_len
            self.read_q[pending.de_node_id] += a.de_read_len
            self.read_total[pe_node] += a.pe_read_len
            self.read_total[pending.de_node_id] += a.de_read_len
            self.requests[req.request_id] = (req, pending.de_engine_id, a.engine_id)
            self.waiting.setdefault(a.engine_id, []).append(
                BatchItem(request_id=req.request_id, cached_len=req.cached_len,
                          new_len=req.new_len))
        self.rr[node] = plan.next_rr_cursor
        self.num_assigned += len(plan.assignments)
        self._log("prefill", view, plan)
        return plan

    # ------------------------------------------------------------------ progress

    def pe_step(self, engine_id: int, now_s: float = 0.0) -> BatchPlan | None:
        """One PE iteration: plan a batch, apply it; finished prefills leave the PE's load."""
        items = self.waiting.get(engine_id)
        if not items:
            return None
        view = BatchView(now_s=now_s, engine_id=engine_id, waiting=tuple(items))
        plan = self.scheduler.plan_prefill_batch(view)
        done = {e.request_id: e for e in plan.entries}
        left: list[BatchItem] = []
        _, pe = self.by_id[engine_id]
        for item in items:
            entry = done.get(item.request_id)
            if entry is None:
                left.append(item)
            elif entry.chunk_len < item.new_len:
                left.append(BatchItem(request_id=item.request_id,
                                      cached_len=item.cached_len + entry.chunk_len,
                                      new_len=item.new_len - entry.chunk_len))
            else:
                pe.num_seqs -= 1
                pe.num_tokens -= self.requests[item.request_id][0].prompt_len
                self.prefilled.append(item.request_id)
        self.waiting[engine_id] = left
        self._log("batch", view, plan)
        return plan

    def drain_reads(self, tokens_per_node: int) -> None:
        for node in self.read_q:
            self.read_q[node] = max(0, self.read_q[node] - tokens_per_node)

    def finish_decode(self, request_id: str) -> None:
        """The request finished decoding: free its DE's HBM and load."""
        req, de_id, _ = self.requests.pop(request_id)
        _, de = self.by_id[de_id]
        de.num_seqs -= 1
        de.num_tokens -= req.decode_len
        de.free_hbm_tokens += req.decode_len

    def _log(self, kind: str, view: View, plan: Plan) -> None:
        if self.record:
            self.log.append((kind, view, plan))

"""The scheduler service's bookkeeping: engines, queues, loads; builds policy views, applies plans.

No I/O and no clock: the service passes ``now_s``. One engine group per emulated node (group id =
node id). Loads are the scheduler's own accounting (``seq_e``/``tok_e`` from what it assigned and
what finished; ``read_q`` per node from reads it dispatched minus reads reported done), which is
what a group leader would report at its fetch, without heartbeat lag.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dualpath.policy import views as pv


@dataclass(slots=True, kw_only=True)
class EngineState:
    engine_id: int
    role: str  # "prefill" | "decode"
    node_id: int
    hbm_tokens: int = 0
    alive: bool = True
    num_seqs: int = 0
    num_tokens: int = 0
    reserved_tokens: int = 0
    last_seen_s: float = 0.0
    data_addr: str = ""
    identity: bytes = b""


@dataclass(slots=True, kw_only=True)
class ReqState:
    info: pv.RequestInfo
    de: int = -1
    pe: int = -1
    assignment: pv.PrefillAssignment | None = None  # the policy's, once its PE is chosen
    pe_done: bool = False
    reads_pending: dict[int, int] = field(default_factory=dict)  # node -> tokens not yet read


class ClusterState:
    """Queues and loads of one cluster; see module docstring."""

    def __init__(self, read_tokens_per_s: float = 1.0) -> None:
        self.engines: dict[int, EngineState] = {}
        self.requests: dict[str, ReqState] = {}
        self.global_queue: list[str] = []
        self.private_queues: dict[int, list[str]] = {}
        self.prefill_queue: list[str] = []
        self.read_q: dict[int, int] = {}
        self.de_rr: dict[int, int] = {}
        self.group_rr = 0
        self.pe_rr: dict[int, int] = {}
        self.read_tokens_per_s = read_tokens_per_s  # default SNIC read rate of a node
        self.read_rate: dict[int, float] = {}  # per-node overrides

    # ----------------------------------------------------------------- membership
    def add_engine(self, eng: EngineState) -> None:
        self.engines[eng.engine_id] = eng
        self.read_q.setdefault(eng.node_id, 0)
        if eng.role == "decode":
            self.private_queues.setdefault(eng.node_id, [])

    def groups(self, role: str, alive_only: bool = True) -> dict[int, list[EngineState]]:
        out: dict[int, list[EngineState]] = {}
        for e in sorted(self.engines.values(), key=lambda e: e.engine_id):
            if e.role == role and (e.alive or not alive_only):
                out.setdefault(e.node_id, []).append(e)
        return dict(sorted(out.items()))

    def _load(self, e: EngineState) -> pv.EngineLoad:
        free = max(e.hbm_tokens - e.reserved_tokens, 0) if e.role == "decode" else 0
        return pv.EngineLoad(engine_id=e.engine_id, num_seqs=e.num_seqs, num_tokens=e.num_tokens,
                             free_hbm_tokens=free)

    # ----------------------------------------------------------------- requests
    def submit(self, info: pv.RequestInfo) -> None:
        self.requests[info.request_id] = ReqState(info=info)
        self.global_queue.append(info.request_id)

    # ----------------------------------------------------------------- decode fetch
    def decode_view(self, node_id: int, now_s: float) -> pv.DecodeFetchView:
        groups = self.groups("decode")
        engines = tuple(self._load(e) for e in groups[node_id])
        totals = tuple(
            pv.GroupTotal(group_id=n, num_tokens=sum(e.num_tokens for e in es) + sum(
                self.requests[r].info.decode_len for r in self.private_queues.get(n, ())))
            for n, es in groups.items())
        return pv.DecodeFetchView(
            now_s=now_s,
            group=pv.GroupLoad(group_id=node_id, node_id=node_id, engines=engines),
            rr_cursor=self.de_rr.get(node_id, 0),
            private_queue=tuple(self.requests[r].info for r in self.private_queues[node_id]),
            global_queue=tuple(self.requests[r].info for r in self.global_queue),
            group_totals=totals, group_rr_cursor=self.group_rr)

    def apply_decode(self, node_id: int, plan: pv.DecodePlan) -> list[str]:
        """Carry out a decode plan; returns the request ids that got a DE (now prefill-queued)."""
        for rt in plan.routings:
            self.private_queues[rt.group_id].append(rt.request_id)
        self.global_queue = []
        queue = self.private_queues[node_id]
        out = []
        for a in plan.assignments:
            assert queue and queue[0] == a.request_id, "policy must pop the private queue head"
            queue.pop(0)
            req, e = self.requests[a.request_id], self.engines[a.engine_id]
            req.de = a.engine_id
            e.num_seqs += 1
            e.num_tokens += req.info.decode_len
            e.reserved_tokens += req.info.decode_len
            self.prefill_queue.append(a.request_id)
            out.append(a.request_id)
        self.de_rr[node_id] = plan.next_rr_cursor
        self.group_rr = plan.next_group_rr_cursor
        return out

    # ----------------------------------------------------------------- prefill fetch
    def prefill_view(self, node_id: int, now_s: float) -> pv.PrefillFetchView:
        group = self.groups("prefill")[node_id]
        queue = tuple(pv.PendingPrefill(request=self.requests[r].info, de_engine_id=self.requests[r].de,
                                        de_node_id=self.engines[self.requests[r].de].node_id)
                      for r in self.prefill_queue)
        nodes = sorted(set(self.read_q) | {node_id} | {p.de_node_id for p in queue})
        return pv.PrefillFetchView(
            now_s=now_s,
            groups=(pv.GroupLoad(group_id=node_id, node_id=node_id,
                                 engines=tuple(self._load(e) for e in group)),),
            queue=queue,
            read_queues=tuple(pv.NodeReadQueue(node_id=n, read_queue_tokens=self.read_q.get(n, 0),
                                               read_tokens_per_s=self.read_rate.get(
                                                   n, self.read_tokens_per_s))
                              for n in nodes),
            rr_cursor=self.pe_rr.get(node_id, 0))

    def apply_prefill(self, node_id: int, plan: pv.PrefillPlan) -> list[str]:
        out = []
        for a in plan.assignments:
            assert self.prefill_queue and self.prefill_queue[0] == a.request_id
            self.prefill_queue.pop(0)
            req, e = self.requests[a.request_id], self.engines[a.engine_id]
            req.pe, req.assignment = a.engine_id, a
            e.num_seqs += 1
            e.num_tokens += req.info.prompt_len
            for node, n in ((e.node_id, a.pe_read_len), (self.engines[req.de].node_id, a.de_read_len)):
                if n:
                    req.reads_pending[node] = req.reads_pending.get(node, 0) + n
                    self.read_q[node] = self.read_q.get(node, 0) + n
            out.append(a.request_id)
        self.pe_rr[node_id] = plan.next_rr_cursor
        return out

    # ----------------------------------------------------------------- completion
    def read_done(self, rid: str, node_id: int) -> None:
        req = self.requests.get(rid)
        if req is not None and node_id in req.reads_pending:
            n = req.reads_pending.pop(node_id)
            self.read_q[node_id] = max(self.read_q.get(node_id, 0) - n, 0)

    def prefill_done(self, rid: str) -> None:
        req = self.requests.get(rid)
        if req is None or req.pe_done or req.pe < 0:
            return
        req.pe_done = True
        e = self.engines[req.pe]
        e.num_seqs -= 1
        e.num_tokens -= req.info.prompt_len

    def finish(self, rid: str) -> ReqState | None:
        """Forget a request wherever it is (done, failed or aborted); release its loads."""
        req = self.requests.pop(rid, None)
        if req is None:
            return None
        for q in (self.global_queue, self.prefill_queue, *self.private_queues.values()):
            if rid in q:
                q.remove(rid)
        if req.pe >= 0 and not req.pe_done:
            e = self.engines[req.pe]
            e.num_seqs -= 1
            e.num_tokens -= req.info.prompt_len
        if req.de >= 0:
            e = self.engines[req.de]
            e.num_seqs -= 1
            e.num_tokens -= req.info.decode_len
            e.reserved_tokens -= req.info.decode_len
        for node, n in req.reads_pending.items():
            self.read_q[node] = max(self.read_q.get(node, 0) - n, 0)
        req.reads_pending.clear()
        return req

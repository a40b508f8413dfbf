"""ReferenceDriver: the smallest driver over the policy's ledger and fetch order.

It keeps no scheduling state of its own: queues, engine loads, read queues and cursors are a
:class:`~dualpath.policy.ledger.Ledger`; it builds views from it, calls a Scheduler and applies
the plans back. It has no time model and no bandwidth model: reads drain and decodes finish only
when the caller says so; a PE's waiting batch items are its own (engine-local) list. Used to
record conformance cases and traces, by the speed benchmark, and as a worked example for the
simulator and runtime drivers. Mutable, single-threaded.
"""

from __future__ import annotations

from collections import deque

from dualpath.core.errors import require
from dualpath.policy.fetch import SIM_ORDER, Fetcher, FetchOrder
from dualpath.policy.ledger import CENTRAL, DECODE, PREFILL, UNBOUNDED, Entry, Ledger, ViewBounds
from dualpath.policy.recovery import lose_engine
from dualpath.policy.scheduler import PolicyScheduler, Scheduler, is_central
from dualpath.policy.views import (
    BatchItem,
    BatchPlan,
    BatchView,
    DecodeFetchView,
    DecodePlan,
    EngineLoad,
    PrefillFetchView,
    PrefillPlan,
    RequestInfo,
)

View = DecodeFetchView | PrefillFetchView | BatchView
Plan = DecodePlan | PrefillPlan | BatchPlan


class ReferenceDriver:
    """PE groups are nodes ``0..num_pe_groups-1``, DE groups the nodes after them; engine ids are
    ``node * engines_per_group + rank``. ``log`` collects ``(kind, view, plan)`` of explicit
    fetches when recording; ``applied`` collects ``(kind, node, plan)`` of every applied plan.
    It is a ``policy.traces.TraceDriver`` too (arrive, tick, read_done, ..., plans)."""

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
        order: FetchOrder = SIM_ORDER,
        bounds: ViewBounds = UNBOUNDED,
    ) -> None:
        require(num_pe_groups > 0, "num_pe_groups", num_pe_groups, "must be > 0")
        require(num_de_groups > 0, "num_de_groups", num_de_groups, "must be > 0")
        require(engines_per_group > 0, "engines_per_group", engines_per_group, "must be > 0")
        self.scheduler = scheduler
        self.pe_nodes = list(range(num_pe_groups))
        self.de_nodes = list(range(num_pe_groups, num_pe_groups + num_de_groups))
        self.ledger = Ledger(read_tokens_per_s=read_tokens_per_s, bounds=bounds)
        self.ledger.add_engines(
            [
                (
                    node * engines_per_group + r,
                    node,
                    DECODE if node >= num_pe_groups else PREFILL,
                    de_hbm_tokens if node >= num_pe_groups else 0,
                )
                for node in self.pe_nodes + self.de_nodes
                for r in range(engines_per_group)
            ]
        )
        beta = scheduler.config.beta_tokens if isinstance(scheduler, PolicyScheduler) else None
        self.fetcher = Fetcher(self.ledger, scheduler, order, self, beta_tokens=beta)
        self.read_total = {n: 0 for n in self.pe_nodes + self.de_nodes}  # tokens ever read
        self._reading: dict[int, deque[str]] = {n: deque() for n in self.read_total}
        self.waiting: dict[int, list[BatchItem]] = {}
        self.attempts: dict[str, int] = {}  # engine losses each request went through (lose_engine)
        self.record = record
        self.log: list[tuple[str, View, Plan]] = []
        self.applied: list[tuple[str, int, DecodePlan | PrefillPlan]] = []
        self.num_assigned = 0
        self.prefilled: deque[str] = deque()  # prefill done, decoding (finish_decode frees them)

    @property
    def engines(self) -> dict[int, list[EngineLoad]]:
        """Each node's engines with their current loads (rank order)."""
        ledger = self.ledger
        return {
            n: list(ledger.group(DECODE if n in ledger.private else PREFILL, n).engines)
            for n in self.pe_nodes + self.de_nodes
        }

    @property
    def read_q(self) -> dict[int, int]:
        return self.ledger.read_q

    # ------------------------------------------------------------------ arrivals and fetches

    def arrive(self, req: RequestInfo) -> None:
        self.ledger.arrive(req)

    def decode_view(self, node: int, now_s: float) -> DecodeFetchView:
        return self.ledger.decode_view(node, now_s)

    def de_fetch(self, node: int, now_s: float = 0.0) -> DecodePlan:
        view = self.decode_view(node, now_s)
        plan = self.scheduler.assign_decode(view)
        self.decode_applied(node, plan, self.ledger.apply(node, plan))
        self._log("decode", view, plan)
        return plan

    def prefill_view(
        self, node: int, now_s: float, window: int | None = None, central: bool | None = None
    ) -> PrefillFetchView:
        return self.ledger.prefill_view(node, now_s, window=window, central=self._central(central))

    def _central(self, central: bool | None) -> bool:
        if central is None:  # the scheduler's PE scope (schedulers without one: "group")
            return is_central(self.scheduler)
        return central

    def pe_fetch(
        self, node: int, now_s: float = 0.0, window: int | None = None, central: bool | None = None
    ) -> PrefillPlan:
        """``window`` limits how much of the prefill queue goes into the view (a driver's speed
        knob; the plan is the same whenever the fetch stops inside the window). ``central``
        offers every PE group as a candidate (central-scheduler mode), not just ``node``'s;
        None: as the scheduler's ``pe_scope`` says."""
        central = self._central(central)
        view = self.prefill_view(node, now_s, window, central)
        plan = self.scheduler.assign_prefill(view)
        self.prefill_applied(node, plan, self.ledger.apply(CENTRAL if central else node, plan))
        self._log("prefill", view, plan)
        return plan

    def tick(self, now_s: float = 0.0) -> None:
        """One fetch round in the driver's fetch order (``policy.fetch``)."""
        self.fetcher.round(now_s)

    # ------------------------------------------------------------------ FetchSink
    def decode_applied(self, node_id: int, plan: DecodePlan, assigned: list[Entry]) -> None:
        self.num_assigned += len(assigned)
        self.applied.append(("decode", node_id, plan))

    def prefill_applied(self, node_id: int, plan: PrefillPlan, assigned: list[Entry]) -> None:
        for entry in assigned:
            for node, n in entry.reads.items():
                self.read_total[node] += n
                self._reading[node].append(entry.info.request_id)
            info = entry.info
            self.waiting.setdefault(entry.pe, []).append(
                BatchItem(request_id=info.request_id, cached_len=info.cached_len, new_len=info.new_len)
            )
        self.num_assigned += len(assigned)
        self.applied.append(("prefill", node_id, plan))

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
        for item in items:
            entry = done.get(item.request_id)
            if entry is None:
                left.append(item)
            elif entry.chunk_len < item.new_len:
                left.append(
                    BatchItem(
                        request_id=item.request_id,
                        cached_len=item.cached_len + entry.chunk_len,
                        new_len=item.new_len - entry.chunk_len,
                    )
                )
            else:
                self.ledger.on_prefill_done(item.request_id)
                self.prefilled.append(item.request_id)
        self.waiting[engine_id] = left
        self._log("batch", view, plan)
        return plan

    def drain_reads(self, tokens_per_node: int) -> None:
        """Every node reads ``tokens_per_node`` more tokens, oldest reads first."""
        ledger = self.ledger
        for node, queue in self._reading.items():
            left = tokens_per_node
            while left > 0 and queue:
                entry = ledger.requests.get(queue[0])
                pending = entry.reads.get(node, 0) if entry is not None else 0
                n = min(left, pending)
                if n:
                    ledger.on_read_done(queue[0], node, n)
                    left -= n
                if n == pending:
                    queue.popleft()

    def finish_decode(self, request_id: str) -> None:
        """The request finished decoding: free its DE's HBM and load."""
        self.ledger.on_finished(request_id)

    # ------------------------------------------------------------------ TraceDriver
    def read_done(self, request_id: str, node_id: int) -> None:
        self.ledger.on_read_done(request_id, node_id)

    def prefill_done(self, request_id: str) -> None:
        self.ledger.on_prefill_done(request_id)
        entry = self.ledger.requests.get(request_id)
        if entry is not None and entry.pe >= 0:
            self.waiting[entry.pe] = [i for i in self.waiting.get(entry.pe, ()) if i.request_id != request_id]

    def finished(self, request_id: str) -> None:
        self.ledger.on_finished(request_id)

    def engine_lost(self, engine_id: int) -> None:
        """Its requests start again at the head of the global queue (or fail, lost a second time:
        ``policy.recovery.lose_engine``), then it leaves."""
        for rid in self.ledger.requests_on(engine_id):
            entry = self.ledger.requests[rid]
            if entry.pe >= 0:
                self.waiting[entry.pe] = [i for i in self.waiting.get(entry.pe, ()) if i.request_id != rid]
        lose_engine(self.ledger, engine_id, self.attempts)

    def plans(self) -> list[tuple[str, int, DecodePlan | PrefillPlan]]:
        return self.applied

    def _log(self, kind: str, view: View, plan: Plan) -> None:
        if self.record:
            self.log.append((kind, view, plan))

"""The simulator's TraceDriver for ``dualpath.policy.traces.replay_traces``.

The trace's events go to the simulator's real :class:`~dualpath.sim.adapter.PolicyAdapter` (its
ledger, fetch rounds and plan hand-off) with real simulated requests (``sim.request.Req``); the
simulation's side of each applied plan (timing, storage claims) is replaced by a recorder, as the
trace has no time model. The simulator never loses an engine; ``engine_lost`` goes to the adapter's
ledger by the runtime's rule (``policy.recovery.lose_engine``: requeue its requests, fail those lost
a second time, then drop it).
"""

from __future__ import annotations

from dualpath.policy.fetch import FetchSink
from dualpath.policy.ledger import Entry
from dualpath.policy.recovery import lose_engine
from dualpath.policy.scheduler import make_scheduler
from dualpath.policy.traces import Trace
from dualpath.policy.views import DecodePlan, PrefillAssignment, PrefillPlan, RequestInfo
from dualpath.sim.adapter import PolicyAdapter
from dualpath.sim.prefill import PeState
from dualpath.sim.request import Agent, Req


class _Tap:
    """The adapter's FetchSink, recording each plan before passing it on."""

    def __init__(self, inner: FetchSink, log: list) -> None:
        self.inner, self.log = inner, log

    def decode_applied(self, node_id: int, plan: DecodePlan, assigned: list[Entry]) -> None:
        self.log.append(("decode", node_id, plan))
        self.inner.decode_applied(node_id, plan, assigned)

    def prefill_applied(self, node_id: int, plan: PrefillPlan, assigned: list[Entry]) -> None:
        self.log.append(("prefill", node_id, plan))
        self.inner.prefill_applied(node_id, plan, assigned)


class SimTraceDriver:
    """``make_driver`` for ``replay_traces``: ``SimTraceDriver(trace)``."""

    def __init__(self, trace: Trace) -> None:
        self.now_s = 0.0
        nodes = {n for _e, n, _r in trace.engines()}
        self.adapter = PolicyAdapter(
            self,
            make_scheduler(trace.policy, trace.config),
            engines=trace.engines(),
            read_rates={n: trace.read_tokens_per_s for n in nodes},
            de_hbm_tokens=trace.de_hbm_tokens,
            order=trace.order,
            bounds=trace.bounds,
        )
        self.log: list = []
        self.adapter.fetcher.sink = _Tap(self.adapter, self.log)
        self.reqs: dict[str, Req] = {}
        self.started: list[tuple[str, int]] = []  # (request, PE) handed to the simulation
        self.attempts: dict[str, int] = {}  # engine losses each request went through

    # ------------------------------------------------------------------ SimSink
    def now(self) -> float:
        return self.now_s

    def request_tick(self) -> None:
        pass  # the trace says when rounds run

    def assign_de(self, req: Req, gpu_id: int) -> None:
        req.de_gpu = gpu_id

    def assign_pe(self, req: Req, assignment: PrefillAssignment) -> None:
        req.pe_gpu = assignment.engine_id
        self.started.append((req.rid, assignment.engine_id))

    def claim_output(self, req: Req) -> bool:
        return True

    def unclaim_output(self, req: Req) -> None:
        pass

    def starved(self, st: PeState) -> None:
        pass

    # ------------------------------------------------------------------ TraceDriver
    def arrive(self, request: RequestInfo) -> None:
        index, turn = (int(x) for x in request.request_id.split(":"))
        req = Req(Agent(index, "trace", []), turn, request.cached_len, request.new_len, request.gen_len, 1)
        assert req.info == request, (req.info, request)
        self.reqs[req.rid] = req
        self.adapter.arrive(req)

    def tick(self, now_s: float) -> None:
        self.now_s = now_s
        self.adapter.tick()

    def read_done(self, request_id: str, node_id: int) -> None:
        self.adapter.read_done(self.reqs[request_id], node_id)

    def prefill_done(self, request_id: str) -> None:
        self.adapter.prefill_done(self.reqs[request_id])

    def finished(self, request_id: str) -> None:
        self.adapter.finished(self.reqs[request_id])

    def engine_lost(self, engine_id: int) -> None:
        lose_engine(self.adapter.ledger, engine_id, self.attempts)

    def plans(self) -> list:
        return self.log

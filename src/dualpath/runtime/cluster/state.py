"""The scheduler service's bookkeeping: engines (addresses, liveness) around the policy's ledger.

No I/O and no clock: the service passes ``now_s``. One engine group per emulated node (group id =
node id). Queues, loads (``seq_e`` / ``tok_e`` / reserved HBM from what the scheduler assigned and
what finished; ``read_q`` per node from reads it dispatched minus reads reported done) and cursors
are a :class:`dualpath.policy.ledger.Ledger`, what a group leader would report at its fetch without
heartbeat lag; fetches run in the shared fetch order (``policy.fetch.RUNTIME_ORDER``: every tick,
groups in node order).
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.policy import views as pv
from dualpath.policy.fetch import RUNTIME_ORDER, Fetcher, FetchOrder
from dualpath.policy.ledger import Entry, Ledger
from dualpath.policy.scheduler import PolicyScheduler, Scheduler


@dataclass(slots=True, kw_only=True)
class EngineState:
    """An engine as the service knows it; its loads are in ``ClusterState.ledger``."""

    engine_id: int
    role: str  # "prefill" | "decode"
    node_id: int
    hbm_tokens: int = 0
    alive: bool = True
    last_seen_s: float = 0.0
    data_addr: str = ""
    identity: bytes = b""
    ready: bool = True  # routable (its EngineReady came; a hello may say it is at once)
    pid: int = 0
    generation: int = 0
    weights_bytes: int = 0
    kv_pool_bytes: int = 0
    rss_bytes: int = 0
    max_prompt_tokens: int = 0  # 0: no bound
    max_context_tokens: int = 0


class ClusterState:
    """Engines and the ledger of one cluster; see module docstring."""

    def __init__(self, read_tokens_per_s: float = 1.0, order: FetchOrder = RUNTIME_ORDER) -> None:
        self.engines: dict[int, EngineState] = {}
        self.ledger = Ledger(read_tokens_per_s=read_tokens_per_s)
        self.order = order
        self._fetcher: Fetcher | None = None
        self._placed: list[str] = []
        self.log: list[tuple[str, int, pv.DecodePlan | pv.PrefillPlan]] | None = None  # if kept

    @property
    def requests(self) -> dict[str, Entry]:
        """Requests in flight (queued or placed), by id."""
        return self.ledger.requests

    # ----------------------------------------------------------------- membership
    def add_engine(self, eng: EngineState) -> None:
        """Register ``eng``; the policy sees it (routes to it) once it is ready."""
        self.engines[eng.engine_id] = eng
        if eng.ready:
            self.ledger.add_engine(eng.engine_id, eng.node_id, eng.role, eng.hbm_tokens)

    def mark_ready(self, eid: int) -> None:
        eng = self.engines[eid]
        eng.ready = True
        if eng.alive:
            self.ledger.add_engine(eng.engine_id, eng.node_id, eng.role, eng.hbm_tokens)

    def remove_engine(self, eid: int) -> None:
        """Forget a dead engine that left (its requests were handled when it died)."""
        self.engines.pop(eid, None)

    def groups(self, role: str, alive_only: bool = True) -> dict[int, list[EngineState]]:
        """Routable engines of ``role`` per node (alive and ready; all registered ones with
        ``alive_only=False``)."""
        out: dict[int, list[EngineState]] = {}
        for e in sorted(self.engines.values(), key=lambda e: e.engine_id):
            if e.role == role and ((e.alive and e.ready) or not alive_only):
                out.setdefault(e.node_id, []).append(e)
        return dict(sorted(out.items()))

    def engine_lost(self, eid: int, keep: frozenset[str] = frozenset()) -> None:
        """After the engine's requests were finished or requeued (but those in ``keep``, which go
        on on their DE): drop it from the views."""
        if eid in self.ledger.engines:
            self.ledger.on_engine_lost(eid, keep)

    # ----------------------------------------------------------------- requests
    def submit(self, info: pv.RequestInfo) -> None:
        self.ledger.arrive(info)

    def fetch(self, sched: Scheduler, now_s: float) -> list[str]:
        """One fetch round; returns the ids of requests that got a PE (and so both engines)."""
        if self._fetcher is None or self._fetcher.scheduler is not sched:
            beta = sched.config.beta_tokens if isinstance(sched, PolicyScheduler) else None
            self._fetcher = Fetcher(self.ledger, sched, self.order, self, beta_tokens=beta)
        self._placed = []
        self._fetcher.round(now_s)
        return self._placed

    def decode_applied(self, node_id: int, plan: pv.DecodePlan, assigned: list[Entry]) -> None:
        if self.log is not None:  # (the DE learns of its request with the dispatch)
            self.log.append(("decode", node_id, plan))

    def prefill_applied(self, node_id: int, plan: pv.PrefillPlan, assigned: list[Entry]) -> None:
        if self.log is not None:
            self.log.append(("prefill", node_id, plan))
        self._placed.extend(e.info.request_id for e in assigned)

    def read_done(self, rid: str, node_id: int) -> None:
        self.ledger.on_read_done(rid, node_id)

    def prefill_done(self, rid: str) -> None:
        self.ledger.on_prefill_done(rid)

    def finish(self, rid: str) -> Entry | None:
        """Forget a request wherever it is (done, failed or aborted); release its loads."""
        return self.ledger.on_finished(rid)

    def requeue(self, rid: str, info: pv.RequestInfo | None = None) -> None:
        """Release the request and put it back at the head of the global queue (as ``info``: a
        resumed request)."""
        self.ledger.on_finished(rid, requeue=True, info=info)


def read_side(entry: Entry) -> str:
    """The read side of the request's assignment, "none" when it has no hit (or no PE yet)."""
    a = entry.assignment
    return a.read_side if a is not None and entry.info.cached_len else "none"

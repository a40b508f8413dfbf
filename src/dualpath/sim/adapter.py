"""The simulator's adapter to ``dualpath.policy``: the ledger, the fetch round, the batch offer.

This is the ONLY place the simulator meets scheduling decisions; it decides nothing itself. The
scheduling state (queues, loads, read queues, cursors) is a ``policy.ledger.Ledger``; fetches run
in the shared ``policy.fetch.FetchOrder`` (the simulator's is the default: 50 ms, round-robin
drain, PE rotation). Group ids are node ids (one group per node, spec section 3);
engine ids are GPU ids. The adapter maps ledger entries back to simulated requests and hands each
applied plan to the simulation (:class:`SimSink`) to start its work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol

from dualpath.policy.batch import NO_LIMITS, BatchLimits, batch_candidates
from dualpath.policy.fetch import SIM_ORDER, Fetcher, FetchOrder
from dualpath.policy.ledger import DECODE, PREFILL, Entry, Ledger, ViewBounds
from dualpath.policy.views import (
    BatchItem,
    BatchPlan,
    BatchView,
    DecodePlan,
    PrefillAssignment,
    PrefillPlan,
)

if TYPE_CHECKING:
    from dualpath.policy.scheduler import PolicyScheduler
    from dualpath.sim.prefill import PeState
    from dualpath.sim.request import Req

BATCH_VIEW_LIMIT: Final = 64


class SimSink(Protocol):
    """What the adapter needs of the simulation: the clock and where applied plans go."""

    def now(self) -> float: ...

    def request_tick(self) -> None: ...

    def assign_de(self, req: Req, gpu_id: int) -> None: ...

    def assign_pe(self, req: Req, assignment: PrefillAssignment) -> None: ...

    def claim_output(self, req: Req) -> bool: ...

    def unclaim_output(self, req: Req) -> None: ...

    def starved(self, st: PeState) -> None: ...


class PolicyAdapter:
    """``engines``: ``(gpu_id, node_id, role "pe" | "de")``; ``read_rates``: node id -> SNIC read
    tokens/s; ``de_hbm_tokens``: KV tokens a DE holds; ``pe_hbm_tokens``: Basic's PE HBM room for
    whole prompts (None: layerwise, no such cut)."""

    def __init__(
        self,
        sim: SimSink,
        scheduler: PolicyScheduler,
        *,
        engines: list[tuple[int, int, str]],
        read_rates: dict[int, float],
        de_hbm_tokens: int,
        pe_hbm_tokens: int | None = None,
        order: FetchOrder = SIM_ORDER,
        bounds: ViewBounds = ViewBounds(),
        batch_limits: BatchLimits | None = None,
    ) -> None:
        self.sim = sim
        self.scheduler = scheduler
        self.ledger = ledger = Ledger(bounds=bounds)
        ledger.add_engines(
            [
                (g, n, DECODE if role == "de" else PREFILL, de_hbm_tokens if role == "de" else 0)
                for g, n, role in engines
            ]
        )
        for node, rate in read_rates.items():
            ledger.set_read_rate(rate, node)
        self.fetcher = Fetcher(ledger, scheduler, order, self, beta_tokens=scheduler.config.beta_tokens)
        # the batch offer's cut and the room the PE reports to its planner: by default Basic's
        # whole prompts in PE HBM and at most BATCH_VIEW_LIMIT requests; ``batch_limits`` instead
        # (the local cluster: every ready request offered, the staging slot's room)
        self.batch_limits = batch_limits or BatchLimits(hbm_tokens=pe_hbm_tokens, max_items=BATCH_VIEW_LIMIT)
        self.plan_limits = NO_LIMITS if batch_limits is None else batch_limits

    @property
    def fetches(self) -> int:
        return self.fetcher.fetches

    # ------------------------------------------------------------------ events
    def arrive(self, req: Req) -> None:
        self.ledger.arrive(req.info).driver = req  # (plans' entries lead back to the Req)

    def tick(self, busy: Callable[[int], bool] | None = None) -> None:
        """One fetch round (the simulation calls it on its fetch timer); ``busy(node)``: PE group
        ``node`` is mid-iteration (skipped when PE groups fetch between iterations)."""
        self.fetcher.round(self.sim.now(), busy)

    def fetch_at_boundary(self, nodes: list[int]) -> None:
        """One unit's PE groups ``nodes`` are between iterations: their fetch
        (``Fetcher.fetch_at_boundary``)."""
        self.fetcher.fetch_at_boundary(nodes, self.sim.now())

    def read_done(self, req: Req, node_id: int | None = None) -> None:
        self.ledger.on_read_done(req.rid, node_id)

    def prefill_done(self, req: Req) -> None:
        self.ledger.on_prefill_done(req.rid)

    def finished(self, req: Req) -> None:
        self.ledger.on_finished(req.rid)

    # ------------------------------------------------------------------ FetchSink
    def decode_applied(self, node_id: int, plan: DecodePlan, assigned: list[Entry]) -> None:
        if plan.routings:
            self.sim.request_tick()  # requests moved into private queues: fetch again next tick
        sim = self.sim
        for entry in assigned:
            sim.assign_de(entry.driver, entry.de)

    def prefill_applied(self, node_id: int, plan: PrefillPlan, assigned: list[Entry]) -> None:
        sim = self.sim
        for entry in assigned:
            a = entry.assignment
            assert a is not None
            sim.assign_pe(entry.driver, a)

    # ------------------------------------------------------------------ PE batch
    def plan_batch(self, st: PeState) -> list[tuple[Req, int, int]]:
        """``[(req, cached_len, chunk_len)]`` for PE ``st``'s next iteration (may be empty)."""
        ready, claimed, view = self.batch_view(st)
        if view is None:
            return []
        return self.apply_batch(ready, claimed, self.scheduler.plan_prefill_batch(view, self.plan_limits))

    def batch_view(self, st: PeState) -> tuple[list[Req], list[Req], BatchView | None]:
        """``(offered, claimed, BatchView | None)``: the PE's requests the policy's batch offer
        takes (reads done, DE-buffer room taken for their output; Basic: whole prompts fitting PE
        HBM), in assignment order, and those whose room was taken by this call."""
        sim = self.sim
        claimed: list[Req] = []

        def admit(req: Req) -> bool:
            if not req.is_ready:
                return False
            if not req.out_claimed:  # room in the DE buffer for the output
                if not sim.claim_output(req):
                    sim.starved(st)
                    return False
                req.out_claimed = True
                claimed.append(req)
            return True

        ready = batch_candidates(st.queue, admit, _prompt_len, self.batch_limits)
        if not ready:
            return ready, claimed, None
        items = tuple(
            [
                BatchItem(
                    request_id=r.rid, cached_len=r.hit_len + r.done_new, new_len=r.miss_len - r.done_new
                )
                for r in ready
            ]
        )
        return ready, claimed, BatchView(now_s=sim.now(), engine_id=st.gpu_id, waiting=items)

    def apply_batch(
        self, ready: list[Req], claimed: list[Req], plan: BatchPlan
    ) -> list[tuple[Req, int, int]]:
        sim = self.sim
        out: list[tuple[Req, int, int]] = []
        for req, entry in zip(ready, plan.entries):
            assert req.rid == entry.request_id
            out.append((req, entry.cached_len, entry.chunk_len))
        picked = {id(r) for r, _c, _n in out}
        for req in claimed:  # give back room taken for requests the plan did not pick
            if id(req) not in picked:
                req.out_claimed = False
                sim.unclaim_output(req)
        return out


def _prompt_len(req: Req) -> int:
    return req.prompt_len

"""The fetch order: when and in which order groups fetch, one shared round for every driver.

A driver calls :func:`fetch_round` once per tick (every ``FetchOrder.interval_s``; the simulator
on the next multiple of it after something changed, the runtime scheduler on its own tick). The
round reads views from the :class:`~dualpath.policy.ledger.Ledger`, calls the scheduler, applies
each plan to the ledger and hands it to the driver's :class:`FetchSink` (to start the work):

1. If the global queue is not empty, one DE group fetches first and drains it (phase 1 routes
   every queued request): the groups in turn (``route_round_robin``) or the first live group.
2. Then DE groups with a non-empty private queue fetch, in group order: those whose state changed
   since the last round (``dirty_only``: requests were routed to them or finished on them) or every
   group but the one that drained the queue.
3. Then PE groups fetch while the prefill queue is not empty, starting one group later each round
   (``rotate_pe``: groups fetch on their own timers; rotating who goes first stands in for that) or
   in group order; with ``dirty_only`` only those whose PEs finished a prefill or that have not
   fetched since the prefill queue grew. A fetch whose plan took the whole bounded prefix
   (``ViewBounds.prefill_prefix``) is repeated at once with the updated loads. A PE fetch's
   candidates are the scheduler's ``pe_scope``: "group" the fetching group's engines only
   (strict leader fetch, the registered policies' default; schedulers without ``pe_scope`` too),
   "central" every live PE group's, so the plan may assign to any group (its assignments are
   handed to the sink at once, as the central scheduler dispatches them).

``pe_fetch_at_boundary``: a PE group fetches between its iterations, as an engine loop does
(receive work, form the batch, run the forward, repeat): the round skips groups that are
mid-iteration (they stay dirty) and the driver calls :meth:`Fetcher.fetch_at_boundary` for a
unit's groups when its iteration ends, before the next batch forms; an idle group fetches on the
tick. A request that arrives while every group is busy waits for the first boundary.

``elide`` skips fetches whose plan is provably empty (``decode.may_assign_decode``,
``prefill.may_assign_prefill``); cursors are unchanged by those, so plans are the same either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from dualpath.policy import fetch_kernels
from dualpath.policy.config import SchedulerConfig
from dualpath.policy.decode import may_assign_decode
from dualpath.policy.ledger import CENTRAL, Entry, Ledger
from dualpath.policy.prefill import may_assign_prefill
from dualpath.policy.scheduler import PolicyScheduler, Scheduler, is_central
from dualpath.policy.views import DecodePlan, PrefillPlan


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchOrder:
    """See the module docstring. The default is the simulator's (spec: a 50 ms fetch period)."""

    interval_s: float = 0.05
    route_round_robin: bool = True
    dirty_only: bool = True
    rotate_pe: bool = True
    elide: bool = True
    pe_fetch_at_boundary: bool = False


SIM_ORDER: Final = FetchOrder()
RUNTIME_ORDER: Final = FetchOrder(
    interval_s=0.002, route_round_robin=False, dirty_only=False, rotate_pe=False
)


class FetchSink(Protocol):
    """The driver's side of a round: start the work of each applied plan."""

    def decode_applied(self, node_id: int, plan: DecodePlan, assigned: list[Entry]) -> None: ...

    def prefill_applied(self, node_id: int, plan: PrefillPlan, assigned: list[Entry]) -> None: ...


class Fetcher:
    """One driver's fetch rounds: ledger, scheduler, order, sink. ``beta_tokens`` (the
    scheduler's beta) enables PE fetch elision; None fetches PE groups whenever there is work."""

    def __init__(
        self,
        ledger: Ledger,
        scheduler: Scheduler,
        order: FetchOrder,
        sink: FetchSink,
        beta_tokens: int | None = None,
    ) -> None:
        self.ledger = ledger
        self.scheduler = scheduler
        self.order = order
        self.sink = sink
        self.beta_tokens = beta_tokens
        self.fetches = 0
        self._rotations: list[list[int]] = []
        self._rotated: list[int] = []  # the PE group list the rotations were made from
        self._boundaries = 0  # boundary fetches so far (fetch_at_boundary's rotation)
        # A registered policy's hot fetches run as kernels over the ledger's lists (no view
        # built, ``policy.fetch_kernels``): balanced DE fetches, least-loaded PE fetches; their
        # plans are the view path's (tests/policy/test_fetch_kernels.py). ``slack`` -1.0 and
        # ``prefill_kernel`` False: every fetch builds its view.
        self.slack = -1.0
        self.prefill_kernel = False
        self.config = SchedulerConfig()
        self.read_choice = ""
        self.central = is_central(scheduler)
        if type(scheduler) is PolicyScheduler:
            self.config, spec = scheduler.config, scheduler.spec
            if spec.de_choice == "balanced":
                self.slack = self.config.hbm_slack
            self.prefill_kernel = spec.pe_choice == "least-loaded"
            self.read_choice = spec.read_choice

    def fetch_decode(self, node_id: int, now_s: float) -> int:
        """One DE group's fetch; returns the number of requests assigned to its DEs."""
        if self.slack >= 0.0:
            plan = fetch_kernels.decode_plan(self.ledger, node_id, self.slack, False)
            assert plan is not None
        else:
            plan = self.scheduler.assign_decode(self.ledger.decode_view(node_id, now_s))
        self.fetches += 1
        assigned = self.ledger.apply_decode(node_id, plan)
        self.sink.decode_applied(node_id, plan, assigned)
        return len(assigned)

    def fetch_decode_kernel(self, node_id: int) -> int:
        """:meth:`fetch_decode` with its elision (:meth:`decode_may_assign`) for a balanced
        policy, from the ledger's lists (``fetch_kernels.decode_plan``); -1: elided."""
        plan = fetch_kernels.decode_plan(self.ledger, node_id, self.slack, self.order.elide)
        if plan is None:
            return -1
        self.fetches += 1
        assigned = self.ledger.apply_decode(node_id, plan)
        self.sink.decode_applied(node_id, plan, assigned)
        return len(assigned)

    def fetch_prefill(self, node_id: int, now_s: float) -> int:
        """One PE group's fetch: over every live PE group (``central``; the plan is applied
        under the central cursor) or this group only (strict leader fetch)."""
        central = self.central
        if self.prefill_kernel:
            kernel = fetch_kernels.central_prefill_plan if central else fetch_kernels.prefill_plan
            plan = kernel(self.ledger, node_id, self.config, self.read_choice)
        else:
            plan = self.scheduler.assign_prefill(self.ledger.prefill_view(node_id, now_s, central=central))
        self.fetches += 1
        assigned = self.ledger.apply_prefill(CENTRAL if central else node_id, plan)
        self.sink.prefill_applied(node_id, plan, assigned)
        return len(assigned)

    def decode_may_assign(self, node_id: int) -> bool:
        """False only if this DE group's fetch would certainly return an empty plan."""
        ledger = self.ledger
        if not self.order.elide or ledger.global_queue:
            return True
        queue = ledger.private.get(node_id)
        if not queue:
            return False
        return may_assign_decode(ledger.free_hbm(node_id), queue[0].decode_len)

    def prefill_may_assign(self, node_id: int) -> bool:
        """False only if every candidate PE (this group's; ``central``: every live PE) is over
        beta (C1)."""
        if not self.order.elide or self.beta_tokens is None:
            return True
        ledger = self.ledger
        tokens = ledger.pe_tokens_all() if self.central else ledger.pe_tokens(node_id)
        return may_assign_prefill(tokens, self.beta_tokens)

    def fetch_at_boundary(self, nodes: list[int], now_s: float) -> None:
        """PE groups ``nodes`` (one unit's, which iterate together) are between iterations: their
        fetch (:meth:`fetch_pe_groups`), the group that goes first rotating from one boundary to
        the next (``rotate_pe``), as the tick's round rotates it; a driver with
        ``pe_fetch_at_boundary`` calls this before the unit's next batch forms."""
        if self.order.rotate_pe and len(nodes) > 1:
            k = self._boundaries % len(nodes)
            nodes = nodes[k:] + nodes[:k]
        self._boundaries += 1
        self.fetch_pe_groups(nodes, now_s)

    def round(self, now_s: float, busy: Callable[[int], bool] | None = None) -> None:
        """One tick's fetches, in the order of the module docstring. ``busy(node)``: whether PE
        group ``node`` is mid-iteration (read only under ``pe_fetch_at_boundary``)."""
        ledger, order = self.ledger, self.order
        de_nodes = ledger.de_nodes
        routed = -1
        if ledger.global_queue and de_nodes:
            if order.route_round_robin:
                routed = de_nodes[ledger.route_turn % len(de_nodes)]
                ledger.route_turn += 1
            else:
                routed = de_nodes[0]
            ledger.de_dirty.discard(routed)
            self.fetch_decode(routed, now_s)
        todo = sorted(ledger.de_dirty) if order.dirty_only else [n for n in de_nodes if n != routed]
        private = ledger.private
        kernel = self.slack >= 0.0
        for node in todo:
            if kernel:
                if private.get(node):
                    self.fetch_decode_kernel(node)
            elif private.get(node) and self.decode_may_assign(node):
                self.fetch_decode(node, now_s)
        ledger.de_dirty.clear()
        pe_nodes = ledger.pe_nodes
        if pe_nodes:
            ledger.pe_turn = (ledger.pe_turn + 1) % len(pe_nodes)
        if not ledger.prefill_queue or not pe_nodes:  # every PE group's fetch would be skipped
            return
        if self._rotated is not pe_nodes:  # (membership changed: a new list)
            self._rotated = pe_nodes
            self._rotations = [pe_nodes[i:] + pe_nodes[:i] for i in range(len(pe_nodes))]
        order_nodes = self._rotations[ledger.pe_turn if order.rotate_pe else 0]
        self.fetch_pe_groups(order_nodes, now_s, busy if order.pe_fetch_at_boundary else None)

    def fetch_pe_groups(
        self, nodes: list[int], now_s: float, busy: Callable[[int], bool] | None = None
    ) -> None:
        """PE groups ``nodes`` fetch, in that order, while the prefill queue is not empty (with
        ``dirty_only`` only dirty groups; a group ``busy`` says is mid-iteration is left dirty
        for its boundary fetch)."""
        ledger, order = self.ledger, self.order
        if not ledger.prefill_queue:
            return
        dirty = ledger.pe_dirty
        if ledger.pe_all_dirty:
            dirty.update(ledger.pe_nodes)
            ledger.pe_all_dirty = False
        limit = ledger.bounds.prefill_prefix
        central = self.central
        may = -1  # central: every group's elision test is the same; kept until the next fetch
        for node in nodes:
            if not ledger.prefill_queue:
                break  # the rest stay dirty, as if visited with nothing to fetch
            if order.dirty_only and node not in dirty:
                continue
            if busy is not None and busy(node):
                continue
            dirty.discard(node)
            if central:
                if may < 0:
                    may = 1 if self.prefill_may_assign(node) else 0
                if not may:
                    continue
            elif not self.prefill_may_assign(node):
                continue
            while (
                self.fetch_prefill(node, now_s) >= (limit if limit is not None else 1 << 62)
                and ledger.prefill_queue
                and self.prefill_may_assign(node)
            ):
                pass  # the plan took the whole prefix: continue with the next one
            may = -1

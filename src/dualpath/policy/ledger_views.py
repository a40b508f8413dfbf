"""The ledger's state and the views read from it (see ``policy.ledger`` for its mutators).

:class:`LedgerViews` holds what the ledger keeps (queues of :class:`Entry`, :class:`Engine` numbers,
``read_q``, cursors, the fetch order's dirty sets) and builds frozen views from it, cached per
group: a mutator marks what it changed (``_changed``) and only that is rebuilt. ``ViewBounds`` are
the queue prefixes a view carries.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Any, Final

from dualpath.policy.views import (
    DecodeFetchView,
    EngineLoad,
    GroupLoad,
    GroupTotal,
    NodeReadQueue,
    PendingPrefill,
    PrefillAssignment,
    PrefillFetchView,
    RequestInfo,
)

DECODE: Final = "decode"
PREFILL: Final = "prefill"
IN_GLOBAL, IN_PRIVATE, IN_PREFILL, PLACED = 0, 1, 2, 3  # where a request is
# The key of the central PE fetch's round-robin cursor in ``pe_rr`` (a central fetch's cursor
# indexes every live PE group's engines, so it is the scheduler's one cursor, not a group's).
CENTRAL: Final = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewBounds:
    """Queue prefixes a view carries; each bound gives the same plan as the whole queue.

    ``prefill_prefix``: PE choice is FIFO and stops at the first request it cannot place, so a plan
    for a prefix is the whole-queue plan cut there (a fetch whose plan takes the whole prefix is
    repeated at once, see ``policy.fetch``); None = the whole queue. ``bound_private``: every DE
    choice assigns a prefix of the private queue whose tokens fit the group's free HBM, so the view
    needs it only up to the first request taking the running sum past that (queues up to
    ``private_full`` long are passed whole). ``all_read_queues_up_to``: clusters with at most this
    many nodes get every node's read queue, larger ones the PE node's and the queued DE nodes'.
    """

    prefill_prefix: int | None = 64
    bound_private: bool = True
    private_full: int = 8
    all_read_queues_up_to: int = 32


UNBOUNDED: Final = ViewBounds(prefill_prefix=None, bound_private=False, all_read_queues_up_to=1 << 30)


@dataclass(slots=True, kw_only=True)
class Engine:
    """One engine's numbers in the ledger (``num_seqs`` = seq_e, ``num_tokens`` = tok_e)."""

    engine_id: int
    node_id: int
    role: str  # DECODE | PREFILL
    is_de: bool = False  # role == DECODE
    key: int = 0  # the group's cache key: 2 * node_id + is_de
    hbm_tokens: int = 0
    alive: bool = True
    num_seqs: int = 0
    num_tokens: int = 0
    reserved_tokens: int = 0


class Entry:
    """One request in the ledger: where it is, its engines, its assignment, its pending reads.

    A plain class with its own ``__init__`` (keyword-only, the fields' defaults), not a
    dataclass: one is built per request, and a dataclass's generated ``__init__`` runs
    interpreted even under mypyc (sim/compiled.py). Compared by identity."""

    __slots__ = (
        "info",
        "decode_len",
        "prompt_len",
        "where",
        "group",
        "de",
        "de_node",
        "pending",
        "pe",
        "assignment",
        "pe_done",
        "reads",
        "driver",
    )

    def __init__(
        self,
        *,
        info: RequestInfo,
        decode_len: int,
        prompt_len: int,
        where: int = IN_GLOBAL,
        group: int = -1,
        de: int = -1,
        de_node: int = -1,
        pending: PendingPrefill | None = None,
        pe: int = -1,
        assignment: PrefillAssignment | None = None,
        pe_done: bool = False,
        reads: dict[int, int] | None = None,
        driver: Any = None,
    ) -> None:
        self.info = info
        self.decode_len = decode_len
        self.prompt_len = prompt_len
        self.where = where
        self.group = group  # the DE group whose private queue holds it
        self.de = de
        self.de_node = de_node
        self.pending = pending
        self.pe = pe
        self.assignment = assignment
        self.pe_done = pe_done
        self.reads: dict[int, int] = {} if reads is None else reads  # node -> tokens not yet read
        # The driver's own object for this request (the simulator's ``Req``), kept across a
        # requeue; the ledger never reads it. Saves drivers an id -> object map beside the ledger's.
        self.driver: Any = driver

    def __repr__(self) -> str:
        return (
            f"Entry(request_id={self.info.request_id!r}, where={self.where}, group={self.group}, "
            f"de={self.de}, pe={self.pe}, pe_done={self.pe_done}, reads={self.reads})"
        )


class LedgerViews:
    """The ledger's state and views; :class:`dualpath.policy.ledger.Ledger` adds the mutators.
    ``read_tokens_per_s``: a node's SNIC read rate unless ``set_read_rate`` gives it its own."""

    def __init__(self, *, read_tokens_per_s: float = 1.0, bounds: ViewBounds = ViewBounds()) -> None:
        self.bounds = bounds
        self.read_tokens_per_s = read_tokens_per_s
        self.engines: dict[int, Engine] = {}
        self.requests: dict[str, Entry] = {}
        self.global_queue: deque[Entry] = deque()
        self.private: dict[int, deque[Entry]] = {}  # live DE groups only
        self.private_tokens: dict[int, int] = {}
        self.prefill_queue: deque[Entry] = deque()
        self.read_q: dict[int, int] = {}
        self.read_rate: dict[int, float] = {}
        self.node_tok: dict[int, int] = {}  # DE node -> sum of its DEs' tok_e
        self.de_rr: dict[int, int] = {}
        self.pe_rr: dict[int, int] = {}
        self.group_rr = 0
        self.route_turn = 0  # fetch order: DE group the next global-queue drain goes to
        self.pe_turn = 0  # fetch order: PE group rotation
        self.de_dirty: set[int] = set()  # DE groups whose fetch may now assign
        self.pe_dirty: set[int] = set()  # PE groups whose fetch may now assign
        self.pe_all_dirty = False  # the prefill queue grew: every PE group may assign
        self.de_nodes: list[int] = []  # live groups, sorted (views and fetch order use these)
        self.pe_nodes: list[int] = []
        self.all_nodes: list[int] = []
        # group caches keyed by 2 * node_id + (1 for DEs): live engines in rank order, loads, ...
        self._members: dict[int, list[int]] = {}
        self._rank: dict[int, int] = {}
        self._groups: dict[int, GroupLoad] = {}
        self._loads: dict[int, list[EngineLoad]] = {}
        self._stale: dict[int, set[int]] = {}
        self._totals: list[GroupTotal | None] = []
        self._totals_pos: dict[int, int] = {}
        self._totals_dirty: set[int] = set()
        self._totals_tuple: tuple[GroupTotal, ...] | None = None  # None: rebuild from the list
        self._token_totals: list[int] = []
        self._reads: dict[int, NodeReadQueue] = {}

    def _membership(self) -> None:
        members: dict[int, list[int]] = {}
        for eid in sorted(self.engines):
            e = self.engines[eid]
            if e.alive:
                members.setdefault(e.key, []).append(eid)
        self._members = members
        self._rank = {eid: i for ids in members.values() for i, eid in enumerate(ids)}
        self.de_nodes = sorted(k // 2 for k in members if k % 2)
        self.pe_nodes = sorted(k // 2 for k in members if not k % 2)
        self.all_nodes = sorted({e.node_id for e in self.engines.values()})
        self._groups.clear()
        self._loads.clear()
        self._stale.clear()
        self._totals = [None] * len(self.de_nodes)
        self._totals_pos = {n: i for i, n in enumerate(self.de_nodes)}
        self._totals_dirty = set(self.de_nodes)
        self._token_totals = [0] * len(self.de_nodes)
        self._totals_tuple = None

    def _changed(self, eng: Engine) -> None:
        """``eng``'s numbers changed: its group's view (and, for a DE, the group total) is stale."""
        key = eng.key
        if key in self._loads:  # (a group never viewed has nothing cached: it is built whole)
            self._groups.pop(key, None)
            stale = self._stale.get(key)
            if stale is None:
                self._stale[key] = {eng.engine_id}
            else:
                stale.add(eng.engine_id)
        if eng.is_de:
            self._totals_dirty.add(eng.node_id)

    # ------------------------------------------------------------------ views
    def group(self, role: str, node_id: int) -> GroupLoad:
        """The node's live engines of ``role`` (rank order) with their loads, cached."""
        return self._group(2 * node_id + (role == DECODE), node_id)

    def _group(self, key: int, node_id: int) -> GroupLoad:
        group = self._groups.get(key)
        if group is not None:
            return group
        loads = self._loads.get(key)
        stale = self._stale.pop(key, None)
        engines = self.engines
        if loads is None:
            loads = [self._load(engines[g]) for g in self._members.get(key, ())]
            self._loads[key] = loads
        elif stale:
            rank = self._rank
            for g in stale:
                eng = engines[g]
                if eng.alive:
                    loads[rank[g]] = self._load(eng)
        group = GroupLoad(group_id=node_id, node_id=node_id, engines=tuple(loads))
        self._groups[key] = group
        return group

    @staticmethod
    def _load(e: Engine) -> EngineLoad:
        free = max(e.hbm_tokens - e.reserved_tokens, 0) if e.is_de else 0
        return EngineLoad(
            engine_id=e.engine_id, num_seqs=e.num_seqs, num_tokens=e.num_tokens, free_hbm_tokens=free
        )

    def token_totals(self) -> list[int]:
        """Every live DE group's engines' ``tok_e`` plus its private queue's ``decode_len``, in
        ``de_nodes`` order: a plain list kept incrementally (only groups a mutator marked are
        recomputed), the routing kernel's input. Read only."""
        dirty = self._totals_dirty
        vals = self._token_totals
        if dirty:
            pos, node_tok, private_tokens = self._totals_pos, self.node_tok, self.private_tokens
            for n in dirty:
                i = pos.get(n)
                if i is not None:
                    vals[i] = node_tok[n] + private_tokens[n]
            dirty.clear()
            self._totals_tuple = None
        return vals

    def group_totals(self) -> tuple[GroupTotal, ...]:
        """:meth:`token_totals` as the views' frozen GroupTotal records (a record is rebuilt only
        when its group's total changed)."""
        vals = self.token_totals()
        totals = self._totals_tuple
        if totals is None:
            out = self._totals
            for i, n in enumerate(self.de_nodes):
                obj = out[i]
                if obj is None or obj.num_tokens != vals[i]:
                    out[i] = GroupTotal(group_id=n, num_tokens=vals[i])
            totals = self._totals_tuple = tuple(out)  # type: ignore[arg-type]
        return totals

    def decode_view(self, node_id: int, now_s: float) -> DecodeFetchView:
        totals = self.group_totals()
        group = self._group(2 * node_id + 1, node_id)
        return DecodeFetchView(
            now_s=now_s,
            group=group,
            private_queue=self._private_prefix(self.private[node_id], group),
            global_queue=tuple([e.info for e in self.global_queue]),
            group_totals=totals,
            rr_cursor=self.de_rr.get(node_id, 0),
            group_rr_cursor=self.group_rr,
        )

    def _private_prefix(self, queue: deque[Entry], group: GroupLoad) -> tuple[RequestInfo, ...]:
        bounds = self.bounds
        if not bounds.bound_private or len(queue) <= bounds.private_full:
            return tuple([e.info for e in queue])
        room = 0
        for engine in group.engines:
            room += engine.free_hbm_tokens
        out: list[RequestInfo] = []
        total = 0
        for entry in queue:
            out.append(entry.info)
            total += entry.decode_len
            if total > room:
                break
        return tuple(out)

    def prefill_view(
        self, node_id: int, now_s: float, *, window: int | None = None, central: bool = False
    ) -> PrefillFetchView:
        """Group ``node_id``'s fetch (``central``: every live PE group is a candidate, in group
        order, with the central cursor ``pe_rr[CENTRAL]``; apply its plan with ``CENTRAL``).
        ``window`` overrides ``bounds.prefill_prefix`` for this view."""
        limit = self.bounds.prefill_prefix if window is None else window
        head = self.prefill_head(limit)
        prefix: list[PendingPrefill] = [e.pending for e in head]  # type: ignore[misc]
        out = [self.read_queue(n) for n in self.read_nodes(node_id, head, central)]
        groups = (
            tuple([self._group(2 * n, n) for n in self.pe_nodes])
            if central
            else (self._group(2 * node_id, node_id),)
        )
        return PrefillFetchView(
            now_s=now_s,
            groups=groups,
            queue=tuple(prefix),
            read_queues=tuple(out),
            rr_cursor=self.pe_rr.get(CENTRAL if central else node_id, 0),
        )

    def prefill_head(self, limit: int | None) -> list[Entry]:
        """The first ``limit`` requests of the prefill queue (all if None)."""
        queue = self.prefill_queue
        return list(queue) if limit is None else list(islice(queue, limit))

    def read_nodes(self, node_id: int, head: list[Entry], central: bool = False) -> list[int]:
        """The nodes whose read queues PE group ``node_id``'s fetch of ``head`` carries: every
        node up to ``bounds.all_read_queues_up_to`` nodes, else its own (``central``: every live
        PE node) and the head's DE nodes."""
        if len(self.all_nodes) <= self.bounds.all_read_queues_up_to:
            return self.all_nodes
        seen = set(self.pe_nodes) if central else {node_id}
        for entry in head:
            seen.add(entry.de_node)
        return sorted(seen)

    def read_queue(self, n: int) -> NodeReadQueue:
        """Node ``n``'s read queue (frozen, rebuilt only when its ``read_q`` changed)."""
        q = self.read_q.get(n, 0)
        obj = self._reads.get(n)
        if obj is None or obj.read_queue_tokens != q:
            obj = NodeReadQueue(
                node_id=n,
                read_queue_tokens=q,
                read_tokens_per_s=self.read_rate.get(n, self.read_tokens_per_s),
            )
            self._reads[n] = obj
        return obj

    def members(self, role: str, node_id: int) -> list[int]:
        """The group's live engine ids, rank order (do not change the list)."""
        return self._members.get(2 * node_id + (role == DECODE), [])

    def engine_load(self, engine_id: int) -> Engine:
        """The engine's numbers (read only: change them through the mutators)."""
        return self.engines[engine_id]

    def free_hbm(self, node_id: int) -> list[int]:
        """Free HBM tokens of the group's live DEs, rank order (no view built)."""
        engines = self.engines
        out: list[int] = []
        for g in self._members.get(2 * node_id + 1, ()):
            e = engines[g]
            out.append(max(e.hbm_tokens - e.reserved_tokens, 0))
        return out

    def pe_tokens_all(self) -> list[int]:
        """``tok_e`` of every live PE, group order then rank order (no view built)."""
        engines = self.engines
        members = self._members
        return [engines[g].num_tokens for n in self.pe_nodes for g in members[2 * n]]

    def pe_tokens(self, node_id: int) -> list[int]:
        """``tok_e`` of the group's live PEs, rank order (no view built)."""
        engines = self.engines
        return [engines[g].num_tokens for g in self._members.get(2 * node_id, ())]

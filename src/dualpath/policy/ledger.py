"""The scheduling ledger: the state that decides what the next view says, with its few mutators.

One :class:`Ledger` per scheduler holds the global queue, each DE group's private queue, the
prefill queue, every engine's ``seq_e`` / ``tok_e`` / reserved HBM, every node's ``read_q`` and the
round-robin cursors. Drivers (the simulator, the runtime scheduler service, the reference driver)
tell it what happened and read views from it; they keep no copy of any of this. Its mutators:

- :meth:`arrive` -- a turn's request joins the global queue (FIFO).
- :meth:`apply` -- carry out a plan the scheduler returned for a view read from this ledger.
  A DecodePlan moves *every* global-queue request to its routed group's private queue, pops the
  assigned prefix of the fetching group's private queue onto its DEs (``seq_e`` += 1, ``tok_e`` and
  reserved HBM += ``decode_len``) and appends each to the prefill queue with its DE. A PrefillPlan
  pops the assigned prefix of the prefill queue onto its PEs (``seq_e`` += 1, ``tok_e`` +=
  ``prompt_len``) and adds ``pe_read_len`` to the PE node's ``read_q`` and ``de_read_len`` to the DE
  node's (the reads are dispatched). The assignment itself (``PrefillAssignment``, read side
  included) is kept on the request: drivers carry it, they do not re-derive it.
- :meth:`on_read_done` -- (part of) a request's read on a node finished: that node's ``read_q``.
- :meth:`on_prefill_done` -- its prefill finished: the PE's ``seq_e`` / ``tok_e``.
- :meth:`on_finished` -- done, failed or aborted wherever it is (queues, PE, DE, reads): every
  load it holds is released; ``requeue=True`` puts it back at the head of the global queue.
- :meth:`on_engine_lost` -- an engine left: its loads are dropped from the views, and a DE group
  left with no live engine gives its private queue back to the head of the global queue.
- :meth:`add_engine` -- membership: an engine joins (or a lost one comes back, emptied).

Views (:meth:`decode_view`, :meth:`prefill_view`) are frozen and cached per group: only the
numbers a mutator changed are rebuilt. ``bounds`` (:class:`ViewBounds`) cuts queue prefixes that
provably give the same plans (the docstrings there say why).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Final

from dualpath.core.errors import DualpathError
from dualpath.policy.views import (
    DecodeFetchView,
    DecodePlan,
    EngineLoad,
    GroupLoad,
    GroupTotal,
    NodeReadQueue,
    PendingPrefill,
    PrefillAssignment,
    PrefillFetchView,
    PrefillPlan,
    RequestInfo,
)

DECODE: Final = "decode"
PREFILL: Final = "prefill"
_GLOBAL, _PRIVATE, _PREFILL, _PLACED = 0, 1, 2, 3  # where a request is


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


UNBOUNDED: Final = ViewBounds(prefill_prefix=None, bound_private=False,
                              all_read_queues_up_to=1 << 30)


@dataclass(slots=True, kw_only=True)
class Engine:
    """One engine's numbers in the ledger (``num_seqs`` = seq_e, ``num_tokens`` = tok_e)."""

    engine_id: int
    node_id: int
    role: str  # DECODE | PREFILL
    hbm_tokens: int = 0
    alive: bool = True
    num_seqs: int = 0
    num_tokens: int = 0
    reserved_tokens: int = 0


@dataclass(slots=True, kw_only=True, eq=False)
class Entry:
    """One request in the ledger: where it is, its engines, its assignment, its pending reads."""

    info: RequestInfo
    decode_len: int
    prompt_len: int
    where: int = _GLOBAL
    group: int = -1  # the DE group whose private queue holds it
    de: int = -1
    de_node: int = -1
    pending: PendingPrefill | None = None
    pe: int = -1
    assignment: PrefillAssignment | None = None
    pe_done: bool = False
    reads: dict[int, int] = field(default_factory=dict)  # node -> tokens not yet read


def _entry(info: RequestInfo) -> Entry:
    prompt = info.cached_len + info.new_len
    return Entry(info=info, decode_len=prompt + info.gen_len, prompt_len=prompt)


def _check(entry: Entry, request_id: str, what: str) -> None:
    if entry.info.request_id != request_id:
        raise DualpathError(f"{what} {request_id!r} is not the queue head "
                            f"{entry.info.request_id!r}")


class Ledger:
    """See the module docstring. ``read_tokens_per_s``: a node's SNIC read rate unless
    :meth:`set_read_rate` gives it its own. Mutable, single-threaded."""

    def __init__(self, *, read_tokens_per_s: float = 1.0,
                 bounds: ViewBounds = ViewBounds()) -> None:
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
        self._members: dict[tuple[str, int], list[int]] = {}  # live engines, rank order
        self._rank: dict[int, int] = {}
        self._groups: dict[tuple[str, int], GroupLoad] = {}
        self._loads: dict[tuple[str, int], list[EngineLoad]] = {}
        self._stale: dict[tuple[str, int], set[int]] = {}
        self._totals: list[GroupTotal | None] = []
        self._totals_pos: dict[int, int] = {}
        self._totals_dirty: set[int] = set()
        self._totals_tuple: tuple[GroupTotal, ...] = ()
        self._reads: dict[int, NodeReadQueue] = {}

    # ------------------------------------------------------------------ membership
    def add_engine(self, engine_id: int, node_id: int, role: str, hbm_tokens: int = 0) -> None:
        """An engine joins (or a lost one is back, emptied). DEs hold ``hbm_tokens`` of KV."""
        self.add_engines([(engine_id, node_id, role, hbm_tokens)])

    def add_engines(self, engines: list[tuple[int, int, str, int]]) -> None:
        """:meth:`add_engine` for each ``(engine_id, node_id, role, hbm_tokens)``."""
        for engine_id, node_id, role, hbm_tokens in engines:
            if role not in (DECODE, PREFILL):
                raise DualpathError(f"engine {engine_id}: role {role!r}; choices: {DECODE}, "
                                    f"{PREFILL}")
            eng = self.engines.get(engine_id)
            if eng is None:
                self.engines[engine_id] = Engine(engine_id=engine_id, node_id=node_id, role=role,
                                                 hbm_tokens=hbm_tokens)
            else:
                eng.alive, eng.hbm_tokens = True, hbm_tokens
            self.read_q.setdefault(node_id, 0)
            if role == DECODE:
                self.private.setdefault(node_id, deque())
                self.private_tokens.setdefault(node_id, 0)
                self.node_tok.setdefault(node_id, 0)
            else:
                self.pe_dirty.add(node_id)
        self._membership()

    def set_read_rate(self, tokens_per_s: float, node_id: int | None = None) -> None:
        """A node's SNIC read rate (every node's default when ``node_id`` is None)."""
        if node_id is None:
            self.read_tokens_per_s = tokens_per_s
        else:
            self.read_rate[node_id] = tokens_per_s
        self._reads.clear()

    def _membership(self) -> None:
        members: dict[tuple[str, int], list[int]] = {}
        for eid in sorted(self.engines):
            e = self.engines[eid]
            if e.alive:
                members.setdefault((e.role, e.node_id), []).append(eid)
        self._members = members
        self._rank = {eid: i for ids in members.values() for i, eid in enumerate(ids)}
        self.de_nodes = sorted(n for r, n in members if r == DECODE)
        self.pe_nodes = sorted(n for r, n in members if r == PREFILL)
        self.all_nodes = sorted({e.node_id for e in self.engines.values()})
        self._groups.clear()
        self._loads.clear()
        self._stale.clear()
        self._totals = [None] * len(self.de_nodes)
        self._totals_pos = {n: i for i, n in enumerate(self.de_nodes)}
        self._totals_dirty = set(self.de_nodes)

    # ------------------------------------------------------------------ mutators
    def arrive(self, info: RequestInfo) -> Entry:
        """A request joins the tail of the global queue."""
        if info.request_id in self.requests:
            raise DualpathError(f"request {info.request_id!r} is already in the ledger")
        entry = _entry(info)
        self.requests[info.request_id] = entry
        self.global_queue.append(entry)
        return entry

    def apply(self, node_id: int, plan: DecodePlan | PrefillPlan) -> list[Entry]:
        """Carry out ``plan`` (from a view of group ``node_id``); returns the requests it
        assigned, in plan order (for a DecodePlan they now wait in the prefill queue)."""
        if isinstance(plan, DecodePlan):
            return self._apply_decode(node_id, plan)
        return self._apply_prefill(node_id, plan)

    def _apply_decode(self, node_id: int, plan: DecodePlan) -> list[Entry]:
        self.de_rr[node_id] = plan.next_rr_cursor
        self.group_rr = plan.next_group_rr_cursor
        dirty = self._totals_dirty
        if plan.routings:
            gq = self.global_queue
            if len(plan.routings) != len(gq):
                raise DualpathError(f"{len(plan.routings)} routings for {len(gq)} queued requests")
            for routing in plan.routings:
                entry = gq.popleft()
                _check(entry, routing.request_id, "routing")
                gid = routing.group_id
                self.private[gid].append(entry)
                entry.where, entry.group = _PRIVATE, gid
                self.private_tokens[gid] = self.private_tokens[gid] + entry.decode_len
                dirty.add(gid)
                self.de_dirty.add(gid)
        out: list[Entry] = []
        if not plan.assignments:
            return out
        queue = self.private[node_id]
        dirty.add(node_id)
        for a in plan.assignments:
            entry = queue.popleft()
            _check(entry, a.request_id, "assignment")
            n = entry.decode_len
            self.private_tokens[node_id] = self.private_tokens[node_id] - n
            eng = self.engines[a.engine_id]
            eng.num_seqs += 1
            eng.num_tokens += n
            eng.reserved_tokens += n
            self.node_tok[eng.node_id] = self.node_tok[eng.node_id] + n
            self._changed(DECODE, eng)
            entry.de, entry.de_node, entry.where = a.engine_id, eng.node_id, _PREFILL
            entry.pending = PendingPrefill(request=entry.info, de_engine_id=a.engine_id,
                                           de_node_id=eng.node_id)
            self.prefill_queue.append(entry)
            out.append(entry)
        self.pe_all_dirty = True
        return out

    def _apply_prefill(self, node_id: int, plan: PrefillPlan) -> list[Entry]:
        self.pe_rr[node_id] = plan.next_rr_cursor
        out: list[Entry] = []
        pq = self.prefill_queue
        read_q = self.read_q
        for a in plan.assignments:
            entry = pq.popleft()
            _check(entry, a.request_id, "assignment")
            if a.pe_read_len + a.de_read_len != entry.info.cached_len:
                raise DualpathError(f"assignment {a.request_id!r}: reads {a.pe_read_len} + "
                                    f"{a.de_read_len} != cached_len {entry.info.cached_len}")
            eng = self.engines[a.engine_id]
            eng.num_seqs += 1
            eng.num_tokens += entry.prompt_len
            self._changed(PREFILL, eng)
            entry.pe, entry.assignment, entry.where = a.engine_id, a, _PLACED
            for node, n in ((eng.node_id, a.pe_read_len), (entry.de_node, a.de_read_len)):
                if n:
                    entry.reads[node] = entry.reads.get(node, 0) + n
                    read_q[node] = read_q[node] + n
            out.append(entry)
        return out

    def on_read_done(self, request_id: str, node_id: int | None = None,
                     tokens: int | None = None) -> None:
        """``tokens`` (all, if None) of the request's read on ``node_id`` (every node, if None)
        finished: they leave that node's ``read_q``. Unknown requests are ignored (late reports)."""
        entry = self.requests.get(request_id)
        if entry is None or not entry.reads:
            return
        for node in [node_id] if node_id is not None else list(entry.reads):
            left = entry.reads.get(node)
            if left is None:
                continue
            n = left if tokens is None else min(tokens, left)
            if n == left:
                del entry.reads[node]
            else:
                entry.reads[node] = left - n
            self.read_q[node] = max(self.read_q[node] - n, 0)

    def on_prefill_done(self, request_id: str) -> None:
        """The request's prefill finished: its PE's ``seq_e`` / ``tok_e`` drop (once)."""
        entry = self.requests.get(request_id)
        if entry is None or entry.pe_done or entry.pe < 0:
            return
        entry.pe_done = True
        self._release_pe(entry)

    def on_finished(self, request_id: str, requeue: bool = False) -> Entry | None:
        """Forget a request wherever it is (finished, failed, aborted): release every load it
        holds. ``requeue``: it starts again at the head of the global queue. Returns the old entry
        (None if unknown)."""
        entry = self.requests.pop(request_id, None)
        if entry is None:
            return None
        if entry.where == _GLOBAL:
            self.global_queue.remove(entry)
        elif entry.where == _PRIVATE:
            self.private[entry.group].remove(entry)
            self.private_tokens[entry.group] -= entry.decode_len
            self._totals_dirty.add(entry.group)
        elif entry.where == _PREFILL:
            self.prefill_queue.remove(entry)
        if entry.pe >= 0 and not entry.pe_done:
            self._release_pe(entry)
        if entry.de >= 0:
            eng = self.engines[entry.de]
            n = entry.decode_len
            eng.num_seqs -= 1
            eng.num_tokens -= n
            eng.reserved_tokens -= n
            self.node_tok[eng.node_id] = self.node_tok[eng.node_id] - n
            self._changed(DECODE, eng)
            self.de_dirty.add(eng.node_id)
        for node, n in entry.reads.items():
            self.read_q[node] = max(self.read_q[node] - n, 0)
        entry.reads.clear()
        if requeue:
            fresh = _entry(entry.info)
            self.requests[request_id] = fresh
            self.global_queue.appendleft(fresh)
        return entry

    def on_engine_lost(self, engine_id: int) -> None:
        """``engine_id`` left. Requests still on it start again at the head of the global queue
        (as :meth:`on_finished` with ``requeue``, in :meth:`requests_on` order; a driver that
        fails some, or must tell their other engine, handles them first). A DE group left without
        a live DE returns its private queue, in order, to the head of the global queue."""
        eng = self.engines[engine_id]
        if not eng.alive:
            return
        for rid in self.requests_on(engine_id):
            self.on_finished(rid, requeue=True)
        eng.alive = False
        if eng.role == DECODE:
            self.node_tok[eng.node_id] -= eng.num_tokens
        eng.num_seqs = eng.num_tokens = eng.reserved_tokens = 0
        self._membership()
        node = eng.node_id
        if eng.role == DECODE and node not in self._totals_pos:
            orphans = self.private.pop(node, deque())
            self.private_tokens.pop(node, None)
            for entry in orphans:
                entry.where, entry.group = _GLOBAL, -1
            self.global_queue.extendleft(reversed(orphans))

    def requests_on(self, engine_id: int) -> list[str]:
        """Ids of the requests placed on ``engine_id`` (as PE or DE), in arrival order."""
        return [rid for rid, e in self.requests.items() if engine_id in (e.pe, e.de)]

    def _release_pe(self, entry: Entry) -> None:
        eng = self.engines[entry.pe]
        eng.num_seqs -= 1
        eng.num_tokens -= entry.prompt_len
        self._changed(PREFILL, eng)
        self.pe_dirty.add(eng.node_id)

    def _changed(self, role: str, eng: Engine) -> None:
        key = (role, eng.node_id)
        self._groups.pop(key, None)
        stale = self._stale.get(key)
        if stale is None:
            self._stale[key] = {eng.engine_id}
        else:
            stale.add(eng.engine_id)
        if role == DECODE:
            self._totals_dirty.add(eng.node_id)

    # ------------------------------------------------------------------ views
    def group(self, role: str, node_id: int) -> GroupLoad:
        """The node's live engines of ``role`` (rank order) with their loads, cached."""
        key = (role, node_id)
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
        free = max(e.hbm_tokens - e.reserved_tokens, 0) if e.role == DECODE else 0
        return EngineLoad(engine_id=e.engine_id, num_seqs=e.num_seqs, num_tokens=e.num_tokens,
                          free_hbm_tokens=free)

    def group_totals(self) -> tuple[GroupTotal, ...]:
        """Every live DE group's engines' ``tok_e`` plus its private queue's ``decode_len``."""
        dirty = self._totals_dirty
        if dirty:  # frozen GroupTotal objects, rebuilt only for groups whose total changed
            out, pos = self._totals, self._totals_pos
            for n in dirty:
                i = pos.get(n)
                if i is None:
                    continue
                value = self.node_tok[n] + self.private_tokens[n]
                obj = out[i]
                if obj is None or obj.num_tokens != value:
                    out[i] = GroupTotal(group_id=n, num_tokens=value)
            dirty.clear()
            self._totals_tuple = tuple(out)  # type: ignore[arg-type]
        return self._totals_tuple

    def decode_view(self, node_id: int, now_s: float) -> DecodeFetchView:
        totals = self.group_totals()
        group = self.group(DECODE, node_id)
        return DecodeFetchView(
            now_s=now_s, group=group,
            private_queue=self._private_prefix(self.private[node_id], group),
            global_queue=tuple([e.info for e in self.global_queue]), group_totals=totals,
            rr_cursor=self.de_rr.get(node_id, 0), group_rr_cursor=self.group_rr)

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

    def prefill_view(self, node_id: int, now_s: float, *, window: int | None = None,
                     central: bool = False) -> PrefillFetchView:
        """Group ``node_id``'s fetch (``central``: every live PE group is a candidate). ``window``
        overrides ``bounds.prefill_prefix`` for this view."""
        limit = self.bounds.prefill_prefix if window is None else window
        head = self.prefill_queue if limit is None else islice(self.prefill_queue, limit)
        prefix: list[PendingPrefill] = []
        if len(self.all_nodes) <= self.bounds.all_read_queues_up_to:
            for entry in head:
                prefix.append(entry.pending)  # type: ignore[arg-type]
            node_ids = self.all_nodes
        else:
            seen = {node_id}
            for entry in head:
                prefix.append(entry.pending)  # type: ignore[arg-type]
                seen.add(entry.de_node)
            node_ids = sorted(seen)
        reads = self._reads  # frozen NodeReadQueue objects, rebuilt only when read_q changed
        out: list[NodeReadQueue] = []
        for n in node_ids:
            q = self.read_q.get(n, 0)
            obj = reads.get(n)
            if obj is None or obj.read_queue_tokens != q:
                obj = NodeReadQueue(node_id=n, read_queue_tokens=q,
                                    read_tokens_per_s=self.read_rate.get(
                                        n, self.read_tokens_per_s))
                reads[n] = obj
            out.append(obj)
        groups = (tuple([self.group(PREFILL, n) for n in self.pe_nodes]) if central
                  else (self.group(PREFILL, node_id),))
        return PrefillFetchView(now_s=now_s, groups=groups, queue=tuple(prefix),
                                read_queues=tuple(out), rr_cursor=self.pe_rr.get(node_id, 0))

    def engine_load(self, engine_id: int) -> Engine:
        """The engine's numbers (read only: change them through the mutators)."""
        return self.engines[engine_id]

    def free_hbm(self, node_id: int) -> list[int]:
        """Free HBM tokens of the group's live DEs, rank order (no view built)."""
        engines = self.engines
        out: list[int] = []
        for g in self._members.get((DECODE, node_id), ()):
            e = engines[g]
            out.append(max(e.hbm_tokens - e.reserved_tokens, 0))
        return out

    def pe_tokens(self, node_id: int) -> list[int]:
        """``tok_e`` of the group's live PEs, rank order (no view built)."""
        engines = self.engines
        return [engines[g].num_tokens for g in self._members.get((PREFILL, node_id), ())]

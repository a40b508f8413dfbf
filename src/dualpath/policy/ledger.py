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

from dualpath.core.errors import DualpathError
from dualpath.policy.ledger_views import (
    CENTRAL,
    DECODE,
    IN_GLOBAL,
    IN_PREFILL,
    IN_PRIVATE,
    PLACED,
    PREFILL,
    UNBOUNDED,
    Engine,
    Entry,
    LedgerViews,
    ViewBounds,
)
from dualpath.policy.views import DecodePlan, PendingPrefill, PrefillPlan, RequestInfo

__all__ = ["CENTRAL", "DECODE", "PREFILL", "UNBOUNDED", "Engine", "Entry", "Ledger", "ViewBounds"]


def _entry(info: RequestInfo) -> Entry:
    prompt = info.cached_len + info.new_len
    return Entry(info=info, decode_len=prompt + info.gen_len, prompt_len=prompt)


def _check(entry: Entry, request_id: str, what: str) -> None:
    if entry.info.request_id != request_id:
        raise DualpathError(f"{what} {request_id!r} is not the queue head {entry.info.request_id!r}")


class Ledger(LedgerViews):
    """See the module docstring. Mutable, single-threaded."""

    # ------------------------------------------------------------------ membership
    def add_engine(self, engine_id: int, node_id: int, role: str, hbm_tokens: int = 0) -> None:
        """An engine joins (or a lost one is back, emptied). DEs hold ``hbm_tokens`` of KV."""
        self.add_engines([(engine_id, node_id, role, hbm_tokens)])

    def add_engines(self, engines: list[tuple[int, int, str, int]]) -> None:
        """:meth:`add_engine` for each ``(engine_id, node_id, role, hbm_tokens)``."""
        for engine_id, node_id, role, hbm_tokens in engines:
            if role not in (DECODE, PREFILL):
                raise DualpathError(f"engine {engine_id}: role {role!r}; choices: {DECODE}, {PREFILL}")
            eng = self.engines.get(engine_id)
            if eng is None:
                is_de = role == DECODE
                self.engines[engine_id] = Engine(
                    engine_id=engine_id,
                    node_id=node_id,
                    role=role,
                    is_de=is_de,
                    key=2 * node_id + is_de,
                    hbm_tokens=hbm_tokens,
                )
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

    # ------------------------------------------------------------------ mutators
    def arrive(self, info: RequestInfo) -> Entry:
        """A request joins the tail of the global queue."""
        entry = _entry(info)
        if self.requests.setdefault(info.request_id, entry) is not entry:
            raise DualpathError(f"request {info.request_id!r} is already in the ledger")
        self.global_queue.append(entry)
        return entry

    def apply(self, node_id: int, plan: DecodePlan | PrefillPlan) -> list[Entry]:
        """Carry out ``plan`` (from a view of group ``node_id``; ``CENTRAL`` for a central PE
        fetch's plan, whose cursor is the central one); returns the requests it assigned, in plan
        order (for a DecodePlan they now wait in the prefill queue)."""
        if isinstance(plan, DecodePlan):
            return self.apply_decode(node_id, plan)
        return self.apply_prefill(node_id, plan)

    def apply_decode(self, node_id: int, plan: DecodePlan) -> list[Entry]:
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
                entry.where, entry.group = IN_PRIVATE, gid
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
            self._changed(eng)
            entry.de, entry.de_node, entry.where = a.engine_id, eng.node_id, IN_PREFILL
            entry.pending = PendingPrefill(
                request=entry.info, de_engine_id=a.engine_id, de_node_id=eng.node_id
            )
            self.prefill_queue.append(entry)
            out.append(entry)
        self.pe_all_dirty = True
        return out

    def apply_prefill(self, node_id: int, plan: PrefillPlan) -> list[Entry]:
        self.pe_rr[node_id] = plan.next_rr_cursor
        out: list[Entry] = []
        pq = self.prefill_queue
        read_q = self.read_q
        for a in plan.assignments:
            entry = pq.popleft()
            _check(entry, a.request_id, "assignment")
            if a.pe_read_len + a.de_read_len != entry.info.cached_len:
                raise DualpathError(
                    f"assignment {a.request_id!r}: reads {a.pe_read_len} + "
                    f"{a.de_read_len} != cached_len {entry.info.cached_len}"
                )
            eng = self.engines[a.engine_id]
            eng.num_seqs += 1
            eng.num_tokens += entry.prompt_len
            self._changed(eng)
            entry.pe, entry.assignment, entry.where = a.engine_id, a, PLACED
            n = a.pe_read_len
            if n:
                node = eng.node_id
                entry.reads[node] = n  # (a request is placed once: nothing pending yet)
                read_q[node] = read_q[node] + n
            n = a.de_read_len
            if n:
                node = entry.de_node
                entry.reads[node] = entry.reads.get(node, 0) + n
                read_q[node] = read_q[node] + n
            out.append(entry)
        return out

    def on_read_done(self, request_id: str, node_id: int | None = None, tokens: int | None = None) -> None:
        """``tokens`` (all, if None) of the request's read on ``node_id`` (every node, if None)
        finished: they leave that node's ``read_q``. Unknown requests are ignored (late reports)."""
        entry = self.requests.get(request_id)
        if entry is None or not entry.reads:
            return
        if node_id is not None and tokens is None:  # the common case: one side's read is done
            n = entry.reads.pop(node_id, 0)
            if n:
                self.read_q[node_id] = max(self.read_q[node_id] - n, 0)
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

    def on_finished(
        self, request_id: str, requeue: bool = False, info: RequestInfo | None = None
    ) -> Entry | None:
        """Forget a request wherever it is (finished, failed, aborted): release every load it
        holds. ``requeue``: it starts again at the head of the global queue, as ``info`` if given
        (a request resuming after an engine's death: ``policy.recovery.resumed_request``). Returns
        the old entry (None if unknown)."""
        entry = self.requests.pop(request_id, None)
        if entry is None:
            return None
        if entry.where == IN_GLOBAL:
            self.global_queue.remove(entry)
        elif entry.where == IN_PRIVATE:
            self.private[entry.group].remove(entry)
            self.private_tokens[entry.group] -= entry.decode_len
            self._totals_dirty.add(entry.group)
        elif entry.where == IN_PREFILL:
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
            self._changed(eng)
            self.de_dirty.add(eng.node_id)
        for node, n in entry.reads.items():
            self.read_q[node] = max(self.read_q[node] - n, 0)
        entry.reads.clear()
        if requeue:
            if info is not None and info.request_id != request_id:
                raise DualpathError(f"requeue of {request_id!r} as {info.request_id!r}")
            fresh = _entry(entry.info if info is None else info)
            fresh.driver = entry.driver
            self.requests[request_id] = fresh
            self.global_queue.appendleft(fresh)
        return entry

    def on_engine_lost(self, engine_id: int, keep: frozenset[str] = frozenset()) -> None:
        """``engine_id`` left. Requests still on it start again at the head of the global queue
        (as :meth:`on_finished` with ``requeue``, in :meth:`requests_on` order; a driver that
        fails some, or must tell their other engine, handles them first), except those in
        ``keep``: requests whose lost engine was their PE and that go on on their DE (already
        streaming); they stay placed, holding nothing more on the lost PE. A DE group left
        without a live DE returns its private queue, in order, to the head of the global queue."""
        eng = self.engines[engine_id]
        if not eng.alive:
            return
        for rid in self.requests_on(engine_id):
            entry = self.requests[rid]
            if rid in keep and entry.pe == engine_id and entry.de != engine_id:
                entry.pe_done = True  # (the lost PE's loads are cleared below)
                continue
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
                entry.where, entry.group = IN_GLOBAL, -1
            self.global_queue.extendleft(reversed(orphans))

    def requests_on(self, engine_id: int) -> list[str]:
        """Ids of the requests placed on ``engine_id`` (as PE or DE), in arrival order."""
        return [rid for rid, e in self.requests.items() if engine_id in (e.pe, e.de)]

    def _release_pe(self, entry: Entry) -> None:
        eng = self.engines[entry.pe]
        eng.num_seqs -= 1
        eng.num_tokens -= entry.prompt_len
        self._changed(eng)
        self.pe_dirty.add(eng.node_id)

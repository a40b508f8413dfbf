"""PE selection and read-path choice for a PE fetch (spec section 8).

Pure: works on private copies of the view's numbers and returns a frozen PrefillPlan.

Tie-breaks (documented in docs/policy.md, "Tie-breaks"): lower class (C2 before C3), then smaller
``tok_e``, then (``config.pe_tie`` "read-queue" only) the smaller node ``read_q``, then earlier
position (group order in the view, then rank order). ``shorter`` read-side ties (equal queues) go
to ``config.read_tie``'s side (default the PE side).
"""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Callable

from dualpath.core.errors import DualpathError
from dualpath.policy.config import READ_TIES, SchedulerConfig
from dualpath.policy.views import (
    NodeReadQueue,
    PrefillAssignment,
    PrefillFetchView,
    PrefillPlan,
    ReadSide,
)

PE_CHOICES: tuple[str, ...] = ("least-loaded", "round-robin")
READ_CHOICES: tuple[str, ...] = ("pe", "de", "shorter", "split", "random")


class _Reads:
    """Mutable per-fetch copy of the read queues: node id -> [tokens, tokens/s]."""

    __slots__ = ("queues", "table")

    def __init__(self, queues: tuple[NodeReadQueue, ...]) -> None:
        self.queues = queues
        self.table: dict[int, list[float]] = {}
        for q in queues:
            if q.node_id in self.table:
                raise DualpathError(f"read_queues: node_id={q.node_id!r} appears twice")
            self.table[q.node_id] = [q.read_queue_tokens, q.read_tokens_per_s]

    def get(self, node_id: int) -> list[float]:
        try:
            return self.table[node_id]
        except KeyError:
            raise DualpathError(f"read_queues has no entry for node_id={node_id!r}") from None

    def freeze(self) -> tuple[NodeReadQueue, ...]:
        """The queues in view order; a node's view object is reused when nothing was added."""
        out = []
        for q in self.queues:
            tokens, rate = self.table[q.node_id]
            if tokens != q.read_queue_tokens or type(q.read_queue_tokens) is not int:
                q = NodeReadQueue(node_id=q.node_id, read_queue_tokens=int(tokens), read_tokens_per_s=rate)
            out.append(q)
        return tuple(out)


def split_read(
    cached_len: int, pe_queue: list[float], de_queue: list[float], block_size: int
) -> tuple[int, int]:
    """Split ``cached_len`` hit tokens so both sides are expected to finish together.

    Solves ``(q_pe + x) / b_pe = (q_de + cached - x) / b_de`` for x (PE tokens), clamps to
    [0, cached] and rounds to whole blocks (half up). PE reads the prefix. Returns (pe, de).
    """
    q_pe, b_pe = pe_queue
    q_de, b_de = de_queue
    if b_pe <= 0 or b_de <= 0:
        raise DualpathError(f"split reads need read_tokens_per_s > 0, got {b_pe!r} and {b_de!r}")
    x = (b_pe * (q_de + cached_len) - b_de * q_pe) / (b_pe + b_de)
    x = min(max(x, 0.0), float(cached_len))
    pe_len = min(int(x / block_size + 0.5) * block_size, cached_len)
    return pe_len, cached_len - pe_len


def choose_read(
    choice: str,
    cached_len: int,
    pe_queue: list[float],
    de_queue: list[float],
    block_size: int,
    request_id: str = "",
    tie: str = "pe",
) -> tuple[ReadSide, int, int]:
    """Return ``(side, pe_read_len, de_read_len)`` and add the reads to the queues (in place).

    ``shorter``: the side whose node has the shorter read queue; on equal queues the ``tie`` side
    (``SchedulerConfig.read_tie``: "pe" or "de"). ``split`` has no such tie (equal queues split by
    the rates). ``random``: the side is drawn 50/50 from a stable hash (CRC-32) of ``request_id``,
    blind to the queues (deterministic: the same id always reads on the same side)."""
    if choice == "pe":
        pe_len = cached_len
    elif choice == "de":
        pe_len = 0
    elif choice == "shorter":
        if tie == "pe":
            pe_len = cached_len if pe_queue[0] <= de_queue[0] else 0
        elif tie == "de":
            pe_len = cached_len if pe_queue[0] < de_queue[0] else 0
        else:
            raise DualpathError(f"read tie {tie!r}; choices: {', '.join(READ_TIES)}")
    elif choice == "split":
        pe_len, _ = split_read(cached_len, pe_queue, de_queue, block_size)
    elif choice == "random":
        pe_len = cached_len if zlib.crc32(request_id.encode()) & 1 else 0
    else:
        raise DualpathError(f"read choice {choice!r}; choices: {', '.join(READ_CHOICES)}")
    de_len = cached_len - pe_len
    pe_queue[0] += pe_len
    de_queue[0] += de_len
    side: ReadSide = "split" if pe_len and de_len else ("de" if de_len else "pe")
    return side, pe_len, de_len


def may_assign_prefill(tokens: list[int], beta_tokens: int) -> bool:
    """Fetch elision for a PE group: no PE choice ever picks an engine over ``beta`` (class C1),
    so False (the plan is certainly empty, cursors unchanged) when every ``tok_e`` is over it."""
    for tok in tokens:
        if tok <= beta_tokens:
            return True
    return False


def assign_prefill(
    view: PrefillFetchView, config: SchedulerConfig, pe_choice: str, read_choice: str
) -> PrefillPlan:
    """Assign PEs (and read sides) to a FIFO prefix of ``view.queue``.

    ``least-loaded``: among engines with ``tok_e <= beta`` pick C2 (node ``read_q <= alpha``)
    before C3, smallest ``tok_e`` first (:func:`least_loaded_plan`). ``round-robin``: the next
    engine at or after the cursor with ``tok_e <= beta``. Each assignment adds ``prompt_len`` to
    the engine's ``tok_e``; the fetch stops at the first request for which no engine qualifies
    (C2 and C3 empty).
    """
    if pe_choice not in PE_CHOICES:
        raise DualpathError(f"pe choice {pe_choice!r}; choices: {', '.join(PE_CHOICES)}")
    ids, tok, spans, group_of = _flat_engines(view)
    reads = _Reads(view.read_queues)
    if pe_choice == "least-loaded":
        out = _least_loaded(view, config, read_choice, (ids, tok, spans), reads)
        return PrefillPlan(assignments=tuple(out), read_queues=reads.freeze(), next_rr_cursor=view.rr_cursor)
    out, cursor = _round_robin_plan(view, config, read_choice, (ids, tok, group_of), reads)
    return PrefillPlan(assignments=tuple(out), read_queues=reads.freeze(), next_rr_cursor=cursor)


def _flat_engines(
    view: PrefillFetchView,
) -> tuple[list[int], list[int], list[tuple[int, int]], list[int]]:
    """The groups' engines as flat arrays: ids, ``tok_e``, each group's slice, each engine's group."""
    ids: list[int] = []
    tok: list[int] = []
    spans: list[tuple[int, int]] = []  # each group's slice of the flat engine arrays
    group_of: list[int] = []
    for g, group in enumerate(view.groups):
        spans.append((len(ids), len(ids) + len(group.engines)))
        for engine in group.engines:
            ids.append(engine.engine_id)
            tok.append(engine.num_tokens)
            group_of.append(g)
    return ids, tok, spans, group_of


def _least_loaded(
    view: PrefillFetchView,
    config: SchedulerConfig,
    read_choice: str,
    engines: tuple[list[int], list[int], list[tuple[int, int]]],
    reads: _Reads,
) -> list[PrefillAssignment]:
    ids, tok, spans = engines
    requests = [p.request for p in view.queue]
    picks = least_loaded_plan(
        tok,
        spans,
        [group.node_id for group in view.groups],
        reads.get,
        [r.cached_len + r.new_len for r in requests],
        [r.cached_len for r in requests],
        [p.de_node_id for p in view.queue],
        [r.request_id for r in requests],
        config,
        read_choice,
    )
    return picked_assignments(picks, ids, [r.request_id for r in requests])


def _round_robin_plan(
    view: PrefillFetchView,
    config: SchedulerConfig,
    read_choice: str,
    engines: tuple[list[int], list[int], list[int]],
    reads: _Reads,
) -> tuple[list[PrefillAssignment], int]:
    """Round-robin assignments of a FIFO prefix of the queue, and the cursor after them."""
    ids, tok, group_of = engines
    out: list[PrefillAssignment] = []
    group_queues = [reads.get(group.node_id) for group in view.groups]
    num = len(ids)
    cursor = view.rr_cursor % num if num else 0
    beta = config.beta_tokens
    for pending in view.queue:
        pick = _round_robin(tok, beta, cursor)
        if pick < 0:
            break
        cursor = (pick + 1) % num
        req = pending.request
        tok[pick] = tok[pick] + req.prompt_len
        side, pe_len, de_len = choose_read(
            read_choice,
            req.cached_len,
            group_queues[group_of[pick]],
            reads.get(pending.de_node_id),
            config.block_size,
            req.request_id,
            config.read_tie,
        )
        out.append(
            PrefillAssignment(
                request_id=req.request_id,
                engine_id=ids[pick],
                read_side=side,
                pe_read_len=pe_len,
                de_read_len=de_len,
            )
        )
    return out, cursor


def least_loaded_plan(
    tok: list[int],
    spans: list[tuple[int, int]],
    group_nodes: list[int],
    queue_of: Callable[[int], list[float]],
    prompt_lens: list[int],
    cached_lens: list[int],
    de_nodes: list[int],
    request_ids: list[str],
    config: SchedulerConfig,
    read_choice: str,
) -> list[tuple[int, ReadSide, int, int]]:
    """``least-loaded`` over one or more candidate PE groups, on plain lists: ``tok`` every
    candidate engine's ``tok_e`` (flat, group by group; updated in place), ``spans`` each group's
    slice of it, ``group_nodes`` each group's node, ``queue_of(node)`` that node's mutable
    ``[read_q, tokens/s]`` (grown in place by each read chosen), and the queue head's
    ``prompt_len`` / ``cached_len`` / DE node / id. Returns, per assigned request in queue order,
    ``(flat engine index, read side, pe_read_len, de_read_len)``. The view entry point
    (:func:`assign_prefill`) and the fetch kernel (``fetch_kernels.central_prefill_plan``) both
    run this."""
    alpha, beta, block = config.alpha_tokens, config.beta_tokens, config.block_size
    group_queues = [queue_of(n) for n in group_nodes]
    best = [_group_best(tok, lo, hi, beta) for lo, hi in spans]
    index = _Candidates(best, tok, group_queues, alpha, config.pe_tie == "read-queue")
    groups_of_node: dict[int, list[int]] = {}
    for g, n in enumerate(group_nodes):
        groups_of_node.setdefault(n, []).append(g)
    group_of: list[int] = []
    for g, (lo, hi) in enumerate(spans):
        group_of.extend([g] * (hi - lo))
    out: list[tuple[int, ReadSide, int, int]] = []
    for i in range(len(prompt_lens)):
        pick = index.pick()
        if pick < 0:
            break
        tok[pick] = tok[pick] + prompt_lens[i]
        g = group_of[pick]
        de_node = de_nodes[i]
        side, pe_len, de_len = choose_read(
            read_choice,
            cached_lens[i],
            group_queues[g],
            queue_of(de_node),
            block,
            request_ids[i],
            config.read_tie,
        )
        best[g] = _group_best(tok, spans[g][0], spans[g][1], beta)
        index.refresh(g)  # its tok_e changed; classes change with the read queues just grown
        for node in (group_nodes[g], de_node):
            for other in groups_of_node.get(node, ()):
                if other != g:
                    index.refresh(other)
        out.append((pick, side, pe_len, de_len))
    return out


def picked_assignments(
    picks: list[tuple[int, ReadSide, int, int]], ids: list[int], request_ids: list[str]
) -> list[PrefillAssignment]:
    """:func:`least_loaded_plan`'s picks as assignments (``ids``: the flat index's engine ids)."""
    return [
        PrefillAssignment(
            request_id=request_ids[i],
            engine_id=ids[pick],
            read_side=side,
            pe_read_len=pe_len,
            de_read_len=de_len,
        )
        for i, (pick, side, pe_len, de_len) in enumerate(picks)
    ]


def least_loaded_picks(tok: list[int], prompt_lens: list[int], beta: int) -> list[int]:
    """``least-loaded`` for one PE group (a strict leader fetch) as a kernel over plain lists:
    ``tok`` the group's ``tok_e`` in rank order (updated in place), ``prompt_lens`` the queue
    head's. With one candidate group the classes C2 / C3 order nothing, so each request goes to
    the smallest ``tok_e <= beta`` (first on ties) until none is left: the picks (ranks) in order,
    the same as :func:`assign_prefill` on the group's view (tested)."""
    out: list[int] = []
    if not tok:
        return out
    for n in prompt_lens:
        smallest = min(tok)
        if smallest > beta:
            break
        i = tok.index(smallest)
        tok[i] = tok[i] + n
        out.append(i)
    return out


def _group_best(tok: list[int], lo: int, hi: int, beta: int) -> int:
    """Flat index of the group's engine with the smallest ``tok_e <= beta`` (first on ties), or
    -1 when the whole group is in C1. Classes are per node, so this is the group's candidate."""
    if lo >= hi:
        return -1
    group = tok[lo:hi]
    smallest = min(group)  # the smallest tok_e is <= beta iff any is
    return lo + group.index(smallest) if smallest <= beta else -1


class _Candidates:
    """Each group's candidate engine (see _group_best) in two heaps, C2 and C3, keyed by
    (tok_e, tie, group position), ``tie`` the node's read_q with ``by_queue`` (``pe_tie``
    "read-queue"), else 0: O(log G) per assignment. Entries go stale when a group's candidate,
    its tok_e or its node's read_q changes; ``refresh`` re-pushes it under a new version and
    ``pick`` discards stale heads."""

    __slots__ = ("best", "tok", "queues", "alpha", "by_queue", "version", "heaps")

    def __init__(
        self, best: list[int], tok: list[int], queues: list[list[float]], alpha: int, by_queue: bool = False
    ) -> None:
        self.best, self.tok, self.queues, self.alpha = best, tok, queues, alpha
        self.by_queue = by_queue
        self.version = [0] * len(best)
        self.heaps: tuple[list[tuple[int, float, int, int, int]], ...] = ([], [])
        for g in range(len(best)):
            self._push(g)

    def _push(self, g: int) -> None:
        i = self.best[g]
        if i >= 0:  # a group whose engines are all C1 (overloaded) is never a candidate
            read_q = self.queues[g][0]
            cls = 0 if read_q <= self.alpha else 1  # C2 = 0, C3 = 1
            tie = read_q if self.by_queue else 0
            heapq.heappush(self.heaps[cls], (self.tok[i], tie, g, self.version[g], i))

    def refresh(self, g: int) -> None:
        self.version[g] = self.version[g] + 1
        self._push(g)

    def pick(self) -> int:
        """Flat index of the chosen engine, or -1 when C2 and C3 are both empty."""
        for heap in self.heaps:
            while heap:
                _, _, g, version, i = heap[0]
                if version == self.version[g]:
                    return i
                heapq.heappop(heap)
        return -1


def _round_robin(tok: list[int], beta: int, cursor: int) -> int:
    num = len(tok)
    for step in range(num):
        i = (cursor + step) % num
        if tok[i] <= beta:
            return i
    return -1

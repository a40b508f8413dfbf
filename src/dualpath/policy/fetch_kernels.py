"""Kernel entry points of a fetch: plans from the ledger's numbers as plain lists, no view built.

A fetch round (``policy.fetch``) runs these for the registered policies' hot cases instead of
building a frozen view and calling the scheduler on it: ``balanced`` DE fetches
(:func:`decode_plan`, over ``decode.route_balanced`` and ``decode.balanced_picks``) and a strict leader
PE fetch with ``least-loaded`` (:func:`prefill_plan`, over ``prefill.least_loaded_picks`` and
``prefill.choose_read``) and a central one (:func:`central_prefill_plan`, every live PE group a
candidate, over ``prefill.least_loaded_plan``, which the view entry point runs too). Each returns the very plan the view entry point gives for the same
ledger state (tests/policy/test_fetch_kernels.py replays fetch sequences through both); the views
stay the serialisation form (the runtime, recorded cases, tests).
"""

from __future__ import annotations

from dualpath.core.errors import DualpathError
from dualpath.policy.config import SchedulerConfig
from dualpath.policy.decode import balanced_picks, may_assign_decode, route_balanced
from dualpath.policy.ledger import CENTRAL, DECODE, PREFILL, Entry, Ledger
from dualpath.policy.prefill import choose_read, least_loaded_picks, least_loaded_plan, picked_assignments
from dualpath.policy.views import (
    DecodeAssignment,
    DecodePlan,
    GroupRouting,
    NodeReadQueue,
    PrefillAssignment,
    PrefillPlan,
)


def decode_plan(ledger: Ledger, node_id: int, slack: float, elide: bool) -> DecodePlan | None:
    """``balanced`` for DE group ``node_id``'s fetch: phase 1 routes the global queue over the
    ledger's group totals, phase 2 assigns the group's private queue head. None (the fetch is
    skipped) only with ``elide``, an empty global queue and a private-queue head no DE holds."""
    gq = ledger.global_queue
    routings: tuple[GroupRouting, ...] = ()
    routed: list[Entry] = []  # requests this fetch routes to its own group
    if gq:
        de_nodes = ledger.de_nodes
        if not de_nodes:
            raise DualpathError("group_totals is empty but the global queue is not")
        positions = route_balanced(ledger.token_totals(), [e.decode_len for e in gq])
        out: list[GroupRouting] = []
        for entry, pos in zip(gq, positions):
            gid = de_nodes[pos]
            out.append(GroupRouting(request_id=entry.info.request_id, group_id=gid))
            if gid == node_id:
                routed.append(entry)
        routings = tuple(out)
    engines = ledger.engines
    ids = ledger.members(DECODE, node_id)
    seq: list[int] = []
    tok: list[int] = []
    free: list[int] = []
    room = 0
    for g in ids:
        e = engines[g]
        seq.append(e.num_seqs)
        tok.append(e.num_tokens)
        f = max(e.hbm_tokens - e.reserved_tokens, 0)
        free.append(f)
        room += f
    queue = ledger.private.get(node_id)
    if elide and not gq and queue and not may_assign_decode(free, queue[0].decode_len):
        return None
    head: list[Entry] = []  # up to the first request past the free HBM (none after it fits)
    if ids:
        total = 0
        for entry in queue or ():
            head.append(entry)
            total += entry.decode_len
            if total > room:
                break
        head.extend(routed)
    picks = balanced_picks(seq, tok, free, [e.decode_len for e in head], slack)
    return DecodePlan(
        routings=routings,
        assignments=tuple(
            [
                DecodeAssignment(request_id=head[i].info.request_id, engine_id=ids[pick])
                for i, pick in enumerate(picks)
            ]
        ),
        next_rr_cursor=ledger.de_rr.get(node_id, 0),
        next_group_rr_cursor=ledger.group_rr,
    )


def prefill_plan(ledger: Ledger, node_id: int, config: SchedulerConfig, read_choice: str) -> PrefillPlan:
    """``least-loaded`` for PE group ``node_id`` alone (strict leader fetch), read sides by
    ``read_choice``, over the head ``bounds.prefill_prefix`` carries."""
    head = ledger.prefill_head(ledger.bounds.prefill_prefix)
    engines = ledger.engines
    ids = ledger.members(PREFILL, node_id)
    picks = least_loaded_picks(
        [engines[g].num_tokens for g in ids], [e.prompt_len for e in head], config.beta_tokens
    )
    queues: dict[int, list[float]] = {}  # nodes whose read queue this plan grows
    out: list[PrefillAssignment] = []
    block = config.block_size
    for i, pick in enumerate(picks):
        req = head[i].info
        pe_q = _queue(ledger, queues, node_id)
        de_q = _queue(ledger, queues, head[i].de_node)
        side, pe_len, de_len = choose_read(
            read_choice, req.cached_len, pe_q, de_q, block, req.request_id, config.read_tie
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
    return _plan(ledger, queues, out, ledger.read_nodes(node_id, head), ledger.pe_rr.get(node_id, 0))


def central_prefill_plan(
    ledger: Ledger, node_id: int, config: SchedulerConfig, read_choice: str
) -> PrefillPlan:
    """``least-loaded`` over every live PE group (``pe_scope`` "central"; the fetching group
    ``node_id`` only decides which read queues the plan carries), read sides by ``read_choice``,
    over the head ``bounds.prefill_prefix`` carries: the plan of ``assign_prefill`` on
    ``ledger.prefill_view(node_id, now_s, central=True)``."""
    head = ledger.prefill_head(ledger.bounds.prefill_prefix)
    engines = ledger.engines
    ids: list[int] = []
    tok: list[int] = []
    spans: list[tuple[int, int]] = []
    pe_nodes = ledger.pe_nodes
    for n in pe_nodes:
        lo = len(ids)
        for g in ledger.members(PREFILL, n):
            ids.append(g)
            tok.append(engines[g].num_tokens)
        spans.append((lo, len(ids)))
    queues: dict[int, list[float]] = {}  # nodes whose read queue this plan may grow

    def queue_of(n: int) -> list[float]:
        return _queue(ledger, queues, n)

    infos = [e.info for e in head]
    request_ids = [r.request_id for r in infos]
    picks = least_loaded_plan(
        tok,
        spans,
        pe_nodes,
        queue_of,
        [e.prompt_len for e in head],
        [r.cached_len for r in infos],
        [e.de_node for e in head],
        request_ids,
        config,
        read_choice,
    )
    out = picked_assignments(picks, ids, request_ids)
    return _plan(ledger, queues, out, ledger.read_nodes(node_id, head, True), ledger.pe_rr.get(CENTRAL, 0))


def _plan(
    ledger: Ledger,
    queues: dict[int, list[float]],
    out: list[PrefillAssignment],
    nodes: list[int],
    cursor: int,
) -> PrefillPlan:
    """The plan of ``out``, carrying the read queues of ``nodes`` as the plan grew them."""
    reads: list[NodeReadQueue] = []
    for n in nodes:
        obj = ledger.read_queue(n)
        grown = queues.get(n)
        if grown is not None and grown[0] != obj.read_queue_tokens:
            obj = NodeReadQueue(node_id=n, read_queue_tokens=int(grown[0]), read_tokens_per_s=grown[1])
        reads.append(obj)
    return PrefillPlan(assignments=tuple(out), read_queues=tuple(reads), next_rr_cursor=cursor)


def _queue(ledger: Ledger, queues: dict[int, list[float]], n: int) -> list[float]:
    q = queues.get(n)
    if q is None:
        obj = ledger.read_queue(n)
        q = queues[n] = [obj.read_queue_tokens, obj.read_tokens_per_s]
    return q

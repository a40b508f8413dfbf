"""DE selection for a DE group's fetch, two levels (spec section 8).

Phase 1 routes the global queue to DE groups; phase 2 assigns the fetching group's private queue
to its DEs. Pure: private copies in, frozen DecodePlan out.

Tie-breaks: phase 1 smallest group total, then earlier position in ``group_totals``; phase 2
(balanced) smallest ``seq_e`` then smallest ``tok_e`` then rank among DEs under Z, otherwise
smallest ``tok_e`` then smallest ``seq_e`` then rank.
"""

from __future__ import annotations

import heapq
from typing import Final

from dualpath.core.errors import DualpathError
from dualpath.policy.config import SchedulerConfig
from dualpath.policy.views import (
    DecodeAssignment,
    DecodeFetchView,
    DecodePlan,
    GroupRouting,
    RequestInfo,
)

DE_CHOICES: tuple[str, ...] = ("balanced", "round-robin")
# Phase 1 with at most this many requests scans the totals (two C loops per request) instead of
# building a heap of every group; both pick the smallest (total, position), so plans are equal.
_SCAN_LIMIT: Final = 8


def route_to_groups(view: DecodeFetchView, de_choice: str) -> tuple[list[GroupRouting], int]:
    """Phase 1: every request of the global queue, in order, to a DE group.

    ``balanced``: the group with the smallest total tokens (updated by ``decode_len`` after each
    routing; a heap keeps this O(log groups) per request). ``round-robin``: groups in turn from
    ``group_rr_cursor``. Returns the routings and the next group cursor.
    """
    totals = view.group_totals
    if not view.global_queue:
        return [], view.group_rr_cursor
    if not totals:
        raise DualpathError("group_totals is empty but the global queue is not")
    out: list[GroupRouting] = []
    if de_choice == "round-robin":
        cursor = view.group_rr_cursor % len(totals)
        for req in view.global_queue:
            out.append(GroupRouting(request_id=req.request_id, group_id=totals[cursor].group_id))
            cursor = (cursor + 1) % len(totals)
        return out, cursor
    positions = route_balanced([g.num_tokens for g in totals], [req.decode_len for req in view.global_queue])
    for req, pos in zip(view.global_queue, positions):
        out.append(GroupRouting(request_id=req.request_id, group_id=totals[pos].group_id))
    return out, view.group_rr_cursor


def route_balanced(tokens: list[int], needs: list[int]) -> list[int]:
    """Phase 1 ``balanced`` as a kernel over plain lists: ``tokens`` the groups' totals (not
    changed), ``needs`` the global queue's ``decode_len`` in order; returns each request's group
    position: the smallest total (updated after each routing), first position on ties."""
    out: list[int] = []
    if len(needs) <= _SCAN_LIMIT:  # a few requests: scan for the first smallest
        tokens = list(tokens)
        for need in needs:
            pos = tokens.index(min(tokens))
            out.append(pos)
            tokens[pos] = tokens[pos] + need
        return out
    # Heap of ``total * n + pos``: ordered as ``(total, pos)`` (ints, ``pos < n``), one integer
    # comparison instead of a tuple's two.
    n = len(tokens)
    heap = [total * n + pos for pos, total in enumerate(tokens)]
    heapq.heapify(heap)
    for need in needs:
        key = heap[0]
        out.append(key % n)
        heapq.heapreplace(heap, key + need * n)
    return out


def may_assign_decode(free_hbm: list[int], head_decode_len: int) -> bool:
    """Fetch elision for a DE group whose fetch has an empty global queue: every DE choice stops
    at a private-queue head that fits no DE, so False (the plan is certainly empty, cursors
    unchanged) when no entry of ``free_hbm`` holds ``head_decode_len``."""
    for free in free_hbm:
        if free >= head_decode_len:
            return True
    return False


def assign_decode(view: DecodeFetchView, config: SchedulerConfig, de_choice: str) -> DecodePlan:
    """Phase 1 then phase 2 for the fetching group; see the module docstring."""
    if de_choice not in DE_CHOICES:
        raise DualpathError(f"de choice {de_choice!r}; choices: {', '.join(DE_CHOICES)}")
    routings, next_group_cursor = route_to_groups(view, de_choice)
    gid = view.group.group_id
    private = list(view.private_queue)
    if routings:
        private.extend(r for r, g in zip(view.global_queue, routings, strict=True) if g.group_id == gid)
    if de_choice == "balanced":
        assignments, cursor = _balanced(view, private, config.hbm_slack), view.rr_cursor
    else:
        assignments, cursor = _round_robin(view, private)
    return DecodePlan(
        routings=tuple(routings),
        assignments=tuple(assignments),
        next_rr_cursor=cursor,
        next_group_rr_cursor=next_group_cursor,
    )


def _balanced(view: DecodeFetchView, private: list[RequestInfo], slack: float) -> list[DecodeAssignment]:
    engines = view.group.engines
    if not engines or not private:
        return []
    picks = balanced_picks(
        [e.num_seqs for e in engines],
        [e.num_tokens for e in engines],
        [e.free_hbm_tokens for e in engines],
        [req.decode_len for req in private],
        slack,
    )
    return [
        DecodeAssignment(request_id=private[i].request_id, engine_id=engines[pick].engine_id)
        for i, pick in enumerate(picks)
    ]


def balanced_picks(
    seq: list[int], tok: list[int], free: list[int], needs: list[int], slack: float
) -> list[int]:
    """Phase 2 ``balanced`` as a kernel over plain lists: the DEs' ``seq_e`` / ``tok_e`` / free
    HBM (rank order; updated in place) and the ``decode_len`` of the private queue's head requests
    (``needs``, queue order). Returns the rank picked for each head request, in order, stopping at
    the first that fits no DE. Both entry points use it: the view's (``assign_decode``) and the
    ledger's (``policy.fetch``, no view built); ``needs`` may stop after the first request that
    takes the cumulative total over the group's free HBM (the rest can not be placed, and R, the
    prefix that fits, ends before it)."""
    num = len(free)
    if num == 0 or not needs:
        return []
    room = sum(free)
    fit = 0  # R = longest prefix of the private queue whose tokens fit the group's free HBM
    for need in needs:
        if fit + need > room:
            break
        fit += need
    z = slack * (fit + sum(tok)) / num
    out: list[int] = []
    for need in needs:
        best = _balanced_pick(seq, tok, free, need, z)
        if best < 0:
            break  # no DE has room for the head: the fetch ends (head-of-line, as specified)
        seq[best] = seq[best] + 1
        tok[best] = tok[best] + need
        free[best] = free[best] - need
        out.append(best)
    return out


def _balanced_pick(seq: list[int], tok: list[int], free: list[int], need: int, z: float) -> int:
    """Index of the DE for a request of ``need`` tokens, or -1 if none has room: among DEs with
    ``tok + need <= z`` the smallest (seq, tok), else the smallest (tok, seq); first on ties."""
    under, under_seq, under_tok = -1, 0, 0
    over, over_tok, over_seq = -1, 0, 0
    for i in range(len(free)):
        if free[i] < need:
            continue
        s, t = seq[i], tok[i]
        if t + need <= z:
            if under < 0 or s < under_seq or (s == under_seq and t < under_tok):
                under, under_seq, under_tok = i, s, t
        elif under < 0 and (over < 0 or t < over_tok or (t == over_tok and s < over_seq)):
            over, over_tok, over_seq = i, t, s
    return under if under >= 0 else over


def _round_robin(view: DecodeFetchView, private: list[RequestInfo]) -> tuple[list[DecodeAssignment], int]:
    engines = view.group.engines
    num = len(engines)
    if num == 0:
        return [], view.rr_cursor
    cursor = view.rr_cursor % num
    free = [e.free_hbm_tokens for e in engines]
    out: list[DecodeAssignment] = []
    for req in private:
        need = req.decode_len
        pick = -1
        for step in range(num):
            i = (cursor + step) % num
            if free[i] >= need:
                pick = i
                break
        if pick < 0:
            break
        free[pick] = free[pick] - need
        cursor = (pick + 1) % num
        out.append(DecodeAssignment(request_id=req.request_id, engine_id=engines[pick].engine_id))
    return out, cursor

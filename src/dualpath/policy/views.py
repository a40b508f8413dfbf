"""Views (read-only state a driver hands the scheduler) and plans (frozen decisions it gets back).

Every class is a frozen, slotted, keyword-only record: drivers build them, the policy never
mutates them, and two equal views always give equal plans. Token counts are plain ``int``; the
paper's names are given in each docstring (``seq_e``, ``tok_e``, ``read_q``). See docs/policy.md
for the driver's calling order and how round-robin cursors are carried.

The records are ``msgspec.Struct`` classes rather than dataclasses for speed alone: their
``__init__`` is C in the pure and the compiled build (a dataclass's generated ``__init__`` runs
interpreted even under mypyc, ~25x slower than a native one, and the simulator builds ~16 views and
plans per request); equality, hashing and ``repr`` are as a dataclass's. ``gc=False``: a record
holds only numbers, strings and tuples of records, so it can not be part of a reference cycle. Field
names: ``msgspec.structs.fields``; a copy with changes: ``msgspec.structs.replace``.
"""

from __future__ import annotations

from typing import Literal

import msgspec

ReadSide = Literal["pe", "de", "split"]
READ_SIDES: tuple[str, ...] = ("pe", "de", "split")


# --------------------------------------------------------------------------- shared pieces


class RequestInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One turn's request as the scheduler sees it.

    ``cached_len``: prompt tokens whose KV is in storage (hits, read on the PE or DE side).
    ``new_len``: prompt tokens to compute (misses, the append). ``gen_len``: tokens the DE must
    also hold for generation (the forced / max length; 0 if the driver admits the prompt only).
    """

    request_id: str
    cached_len: int
    new_len: int
    gen_len: int = 0

    @property
    def prompt_len(self) -> int:
        """Tokens a PE accounts for this request (``tok_e`` contribution on a PE)."""
        return self.cached_len + self.new_len

    @property
    def decode_len(self) -> int:
        """Tokens a DE must hold in HBM for this request (``len_r`` / ``tok_e`` on a DE)."""
        return self.cached_len + self.new_len + self.gen_len


class EngineLoad(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One engine's load as reported at its group's fetch.

    ``num_seqs`` is the paper's ``seq_e`` (unfinished requests assigned to it), ``num_tokens`` its
    ``tok_e`` (their tokens: ``prompt_len`` on a PE, ``decode_len`` on a DE), ``free_hbm_tokens``
    the KV tokens it can still admit (DEs; after subtracting tokens already reserved for requests
    assigned but not yet decoding; PEs report 0).
    """

    engine_id: int
    num_seqs: int
    num_tokens: int
    free_hbm_tokens: int = 0


class NodeReadQueue(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A node's storage read queue: ``read_queue_tokens`` is the paper's ``read_q`` (hit tokens
    queued to read from storage on that node), ``read_tokens_per_s`` its SNIC read rate in tokens/s
    (used only by the split policy)."""

    node_id: int
    read_queue_tokens: int
    read_tokens_per_s: float = 1.0


class GroupLoad(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One engine group (= one node, all PEs or all DEs) at its leader's fetch.

    ``engines`` are in rank order; the order must be stable between fetches because round-robin
    cursors index into it.
    """

    group_id: int
    node_id: int
    engines: tuple[EngineLoad, ...]


class GroupTotal(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A DE group's total load for phase 1: ``num_tokens`` = sum of ``tok_e`` over its engines plus
    the ``decode_len`` of requests waiting in its private queue."""

    group_id: int
    num_tokens: int


# --------------------------------------------------------------------------- decode fetch


class DecodeFetchView(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A DE group's fetch. Phase 1 routes every request of ``global_queue`` (FIFO) to a DE group;
    phase 2 assigns DEs of ``group`` to the head of its private queue, which is ``private_queue``
    followed by the requests phase 1 routed to this group in this fetch.

    ``group_totals`` lists every DE group (the fetching one included), in a stable order.
    ``rr_cursor`` is the round-robin position in ``group.engines`` and ``group_rr_cursor`` the one
    in ``group_totals`` (used by round-robin policies only; the plan returns the next values).
    """

    now_s: float
    group: GroupLoad
    private_queue: tuple[RequestInfo, ...]
    global_queue: tuple[RequestInfo, ...]
    group_totals: tuple[GroupTotal, ...]
    rr_cursor: int = 0
    group_rr_cursor: int = 0


class GroupRouting(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Phase 1 decision: ``request_id`` joins the private queue of DE group ``group_id``."""

    request_id: str
    group_id: int


class DecodeAssignment(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Phase 2 decision: ``request_id`` decodes on DE ``engine_id`` (reserve ``decode_len`` tokens)."""

    request_id: str
    engine_id: int


class DecodePlan(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Result of ``assign_decode``. ``routings`` covers the whole global queue, in its order.
    ``assignments`` are popped from the head of the fetching group's private queue, in order; the
    rest stays queued. ``next_rr_cursor`` / ``next_group_rr_cursor`` are the cursors the driver
    stores for the next fetch (unchanged by non-round-robin policies)."""

    routings: tuple[GroupRouting, ...]
    assignments: tuple[DecodeAssignment, ...]
    next_rr_cursor: int
    next_group_rr_cursor: int


# --------------------------------------------------------------------------- prefill fetch


class PendingPrefill(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A request waiting for a PE; its DE (``de_engine_id`` on node ``de_node_id``) is known."""

    request: RequestInfo
    de_engine_id: int
    de_node_id: int


class PrefillFetchView(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A PE fetch: take requests FIFO from the head of ``queue`` (the global prefill queue).

    ``groups`` are the candidate PE groups: with strict leader fetch just the fetching group; a
    central scheduler may pass every PE group (with their last reported loads), and the plan may
    then assign to any of them. ``rr_cursor`` is the round-robin position in the concatenation of
    the groups' ``engines``. ``read_queues`` holds the read queue of every candidate PE node and of
    every DE node that appears in ``queue`` (more is fine), one entry per node id.
    """

    now_s: float
    groups: tuple[GroupLoad, ...]
    queue: tuple[PendingPrefill, ...]
    read_queues: tuple[NodeReadQueue, ...]
    rr_cursor: int = 0


class PrefillAssignment(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """``request_id`` prefills on PE ``engine_id``. Its ``cached_len`` hit tokens are read as
    ``pe_read_len`` tokens on the PE node (the prefix) and ``de_read_len`` on the DE node (the
    rest); ``read_side`` is "pe" or "de" when one of them is 0, else "split"."""

    request_id: str
    engine_id: int
    read_side: ReadSide
    pe_read_len: int
    de_read_len: int


class PrefillPlan(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Result of ``assign_prefill``: assignments for a prefix of the queue, in queue order.
    ``read_queues`` is the plan's bookkeeping: each node's read queue after adding the reads
    assigned here (the driver may use it or recompute it). ``next_rr_cursor`` as in DecodePlan."""

    assignments: tuple[PrefillAssignment, ...]
    read_queues: tuple[NodeReadQueue, ...]
    next_rr_cursor: int


# --------------------------------------------------------------------------- PE batch


class BatchItem(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A request on a PE that still has tokens to compute: ``cached_len`` tokens have KV already
    (hits plus chunks computed earlier), ``new_len`` tokens remain; ``started``: this PE computed a
    chunk of it already (an earlier batch cut it)."""

    request_id: str
    cached_len: int
    new_len: int
    started: bool = False


class BatchView(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One PE's next iteration. ``waiting`` is FIFO (assignment order) and holds only requests the
    driver considers ready to compute (e.g. KV load started, for layerwise prefill)."""

    now_s: float
    engine_id: int
    waiting: tuple[BatchItem, ...]


class BatchEntry(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Compute ``chunk_len`` tokens of ``request_id`` on top of its ``cached_len`` tokens."""

    request_id: str
    cached_len: int
    chunk_len: int


class BatchPlan(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Result of ``plan_prefill_batch``: a FIFO prefix of ``waiting``; only the last entry may be
    chunked (``chunk_len < new_len``). ``attention_s`` is the predicted attention time of one layer
    (0.0 when the policy batches by tokens without a predictor)."""

    entries: tuple[BatchEntry, ...]
    attention_s: float

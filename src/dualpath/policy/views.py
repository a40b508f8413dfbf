"""Views (read-only state a driver hands the scheduler) and plans (frozen decisions it gets back).

Every class is a frozen, slotted, keyword-only dataclass: drivers build them, the policy never
mutates them, and two equal views always give equal plans. Token counts are plain ``int``; the
paper's names are given in each docstring (``seq_e``, ``tok_e``, ``read_q``). See docs/policy.md
for the driver's calling order and how round-robin cursors are carried.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Literal, TypeVar

ReadSide = Literal["pe", "de", "split"]
READ_SIDES: tuple[str, ...] = ("pe", "de", "split")

_T = TypeVar("_T")


def _fast_init(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted dataclass a faster ``__init__`` with the same signature.

    The generated ``__init__`` of a frozen dataclass sets each field with ``object.__setattr__``;
    this one calls each slot descriptor's ``__set__`` directly (which is what that ends up doing),
    about 1.5x faster. Views and plans are built several times per simulated request, so this is
    measurable. Everything else (frozen ``__setattr__``, ``__eq__``, ``__hash__``, ``__repr__``,
    keyword-only arguments and defaults) is the dataclass's own. No field may have a factory.
    """
    assert not hasattr(cls, "__post_init__"), f"{cls.__name__}: __post_init__ would be skipped"
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    namespace: dict = {f"_set_{n}": getattr(cls, n).__set__ for n in names}
    params = []
    for f in fields(cls):  # type: ignore[arg-type]
        assert f.default_factory is MISSING, f"{cls.__name__}.{f.name}: no factories here"
        if f.default is MISSING:
            params.append(f.name)
        else:
            namespace[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
    body = "".join(f"    _set_{n}(self, {n})\n" for n in names)
    exec(f"def __init__(self, *, {', '.join(params)}):\n{body}", namespace)  # noqa: S102
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls



# --------------------------------------------------------------------------- shared pieces


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class RequestInfo:
    """One turn's request as the scheduler sees it.

    ``cached_len``: prompt tokens whose KV is in storage (hits, read on the PE or DE side).
    ``new_len``: prompt tokens to compute (misses, the append). ``gen_len``: tokens the DE must
    also hold for generation (the forced / max length; 0 if the driver admits the prompt only).
    """

    request_id: str
    cached_len: int
    new_len: int
    gen_len: int = 0

    def __init__(self, *, request_id: str, cached_len: int, new_len: int, gen_len: int = 0) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "cached_len", cached_len)
        object.__setattr__(self, "new_len", new_len)
        object.__setattr__(self, "gen_len", gen_len)

    @property
    def prompt_len(self) -> int:
        """Tokens a PE accounts for this request (``tok_e`` contribution on a PE)."""
        return self.cached_len + self.new_len

    @property
    def decode_len(self) -> int:
        """Tokens a DE must hold in HBM for this request (``len_r`` / ``tok_e`` on a DE)."""
        return self.cached_len + self.new_len + self.gen_len


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class EngineLoad:
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

    def __init__(
        self,
        *,
        engine_id: int,
        num_seqs: int,
        num_tokens: int,
        free_hbm_tokens: int = 0,
    ) -> None:
        object.__setattr__(self, "engine_id", engine_id)
        object.__setattr__(self, "num_seqs", num_seqs)
        object.__setattr__(self, "num_tokens", num_tokens)
        object.__setattr__(self, "free_hbm_tokens", free_hbm_tokens)


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class NodeReadQueue:
    """A node's storage read queue: ``read_queue_tokens`` is the paper's ``read_q`` (hit tokens
    queued to read from storage on that node), ``read_tokens_per_s`` its SNIC read rate in tokens/s
    (used only by the split policy)."""

    node_id: int
    read_queue_tokens: int
    read_tokens_per_s: float = 1.0

    def __init__(
        self,
        *,
        node_id: int,
        read_queue_tokens: int,
        read_tokens_per_s: float = 1.0,
    ) -> None:
        object.__setattr__(self, "node_id", node_id)
        object.__setattr__(self, "read_queue_tokens", read_queue_tokens)
        object.__setattr__(self, "read_tokens_per_s", read_tokens_per_s)


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class GroupLoad:
    """One engine group (= one node, all PEs or all DEs) at its leader's fetch.

    ``engines`` are in rank order; the order must be stable between fetches because round-robin
    cursors index into it.
    """

    group_id: int
    node_id: int
    engines: tuple[EngineLoad, ...]

    def __init__(self, *, group_id: int, node_id: int, engines: tuple[EngineLoad, ...]) -> None:
        object.__setattr__(self, "group_id", group_id)
        object.__setattr__(self, "node_id", node_id)
        object.__setattr__(self, "engines", engines)


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class GroupTotal:
    """A DE group's total load for phase 1: ``num_tokens`` = sum of ``tok_e`` over its engines plus
    the ``decode_len`` of requests waiting in its private queue."""

    group_id: int
    num_tokens: int

    def __init__(self, *, group_id: int, num_tokens: int) -> None:
        object.__setattr__(self, "group_id", group_id)
        object.__setattr__(self, "num_tokens", num_tokens)


# --------------------------------------------------------------------------- decode fetch


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class DecodeFetchView:
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

    def __init__(
        self,
        *,
        now_s: float,
        group: GroupLoad,
        private_queue: tuple[RequestInfo, ...],
        global_queue: tuple[RequestInfo, ...],
        group_totals: tuple[GroupTotal, ...],
        rr_cursor: int = 0,
        group_rr_cursor: int = 0,
    ) -> None:
        object.__setattr__(self, "now_s", now_s)
        object.__setattr__(self, "group", group)
        object.__setattr__(self, "private_queue", private_queue)
        object.__setattr__(self, "global_queue", global_queue)
        object.__setattr__(self, "group_totals", group_totals)
        object.__setattr__(self, "rr_cursor", rr_cursor)
        object.__setattr__(self, "group_rr_cursor", group_rr_cursor)


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class GroupRouting:
    """Phase 1 decision: ``request_id`` joins the private queue of DE group ``group_id``."""

    request_id: str
    group_id: int

    def __init__(self, *, request_id: str, group_id: int) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "group_id", group_id)


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class DecodeAssignment:
    """Phase 2 decision: ``request_id`` decodes on DE ``engine_id`` (reserve ``decode_len`` tokens)."""

    request_id: str
    engine_id: int

    def __init__(self, *, request_id: str, engine_id: int) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "engine_id", engine_id)


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class DecodePlan:
    """Result of ``assign_decode``. ``routings`` covers the whole global queue, in its order.
    ``assignments`` are popped from the head of the fetching group's private queue, in order; the
    rest stays queued. ``next_rr_cursor`` / ``next_group_rr_cursor`` are the cursors the driver
    stores for the next fetch (unchanged by non-round-robin policies)."""

    routings: tuple[GroupRouting, ...]
    assignments: tuple[DecodeAssignment, ...]
    next_rr_cursor: int
    next_group_rr_cursor: int

    def __init__(
        self,
        *,
        routings: tuple[GroupRouting, ...],
        assignments: tuple[DecodeAssignment, ...],
        next_rr_cursor: int,
        next_group_rr_cursor: int,
    ) -> None:
        object.__setattr__(self, "routings", routings)
        object.__setattr__(self, "assignments", assignments)
        object.__setattr__(self, "next_rr_cursor", next_rr_cursor)
        object.__setattr__(self, "next_group_rr_cursor", next_group_rr_cursor)


# --------------------------------------------------------------------------- prefill fetch


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class PendingPrefill:
    """A request waiting for a PE; its DE (``de_engine_id`` on node ``de_node_id``) is known."""

    request: RequestInfo
    de_engine_id: int
    de_node_id: int

    def __init__(self, *, request: RequestInfo, de_engine_id: int, de_node_id: int) -> None:
        object.__setattr__(self, "request", request)
        object.__setattr__(self, "de_engine_id", de_engine_id)
        object.__setattr__(self, "de_node_id", de_node_id)


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class PrefillFetchView:
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

    def __init__(
        self,
        *,
        now_s: float,
        groups: tuple[GroupLoad, ...],
        queue: tuple[PendingPrefill, ...],
        read_queues: tuple[NodeReadQueue, ...],
        rr_cursor: int = 0,
    ) -> None:
        object.__setattr__(self, "now_s", now_s)
        object.__setattr__(self, "groups", groups)
        object.__setattr__(self, "queue", queue)
        object.__setattr__(self, "read_queues", read_queues)
        object.__setattr__(self, "rr_cursor", rr_cursor)


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class PrefillAssignment:
    """``request_id`` prefills on PE ``engine_id``. Its ``cached_len`` hit tokens are read as
    ``pe_read_len`` tokens on the PE node (the prefix) and ``de_read_len`` on the DE node (the
    rest); ``read_side`` is "pe" or "de" when one of them is 0, else "split"."""

    request_id: str
    engine_id: int
    read_side: ReadSide
    pe_read_len: int
    de_read_len: int

    def __init__(
        self,
        *,
        request_id: str,
        engine_id: int,
        read_side: ReadSide,
        pe_read_len: int,
        de_read_len: int,
    ) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "engine_id", engine_id)
        object.__setattr__(self, "read_side", read_side)
        object.__setattr__(self, "pe_read_len", pe_read_len)
        object.__setattr__(self, "de_read_len", de_read_len)


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class PrefillPlan:
    """Result of ``assign_prefill``: assignments for a prefix of the queue, in queue order.
    ``read_queues`` is the plan's bookkeeping: each node's read queue after adding the reads
    assigned here (the driver may use it or recompute it). ``next_rr_cursor`` as in DecodePlan."""

    assignments: tuple[PrefillAssignment, ...]
    read_queues: tuple[NodeReadQueue, ...]
    next_rr_cursor: int

    def __init__(
        self,
        *,
        assignments: tuple[PrefillAssignment, ...],
        read_queues: tuple[NodeReadQueue, ...],
        next_rr_cursor: int,
    ) -> None:
        object.__setattr__(self, "assignments", assignments)
        object.__setattr__(self, "read_queues", read_queues)
        object.__setattr__(self, "next_rr_cursor", next_rr_cursor)


# --------------------------------------------------------------------------- PE batch


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class BatchItem:
    """A request on a PE that still has tokens to compute: ``cached_len`` tokens have KV already
    (hits plus chunks computed earlier), ``new_len`` tokens remain."""

    request_id: str
    cached_len: int
    new_len: int

    def __init__(self, *, request_id: str, cached_len: int, new_len: int) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "cached_len", cached_len)
        object.__setattr__(self, "new_len", new_len)


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class BatchView:
    """One PE's next iteration. ``waiting`` is FIFO (assignment order) and holds only requests the
    driver considers ready to compute (e.g. KV load started, for layerwise prefill)."""

    now_s: float
    engine_id: int
    waiting: tuple[BatchItem, ...]

    def __init__(self, *, now_s: float, engine_id: int, waiting: tuple[BatchItem, ...]) -> None:
        object.__setattr__(self, "now_s", now_s)
        object.__setattr__(self, "engine_id", engine_id)
        object.__setattr__(self, "waiting", waiting)


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class BatchEntry:
    """Compute ``chunk_len`` tokens of ``request_id`` on top of its ``cached_len`` tokens."""

    request_id: str
    cached_len: int
    chunk_len: int

    def __init__(self, *, request_id: str, cached_len: int, chunk_len: int) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "cached_len", cached_len)
        object.__setattr__(self, "chunk_len", chunk_len)


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class BatchPlan:
    """Result of ``plan_prefill_batch``: a FIFO prefix of ``waiting``; only the last entry may be
    chunked (``chunk_len < new_len``). ``attention_s`` is the predicted attention time of one layer
    (0.0 when the policy batches by tokens without a predictor)."""

    entries: tuple[BatchEntry, ...]
    attention_s: float

    def __init__(self, *, entries: tuple[BatchEntry, ...], attention_s: float) -> None:
        object.__setattr__(self, "entries", entries)
        object.__setattr__(self, "attention_s", attention_s)


# Built by mypyc (setup.py, DUALPATH_COMPILE=1), these are native classes with a compiled __init__;
# in pure Python they get the faster generated one.
if __file__.endswith(".py"):
    for _cls in (RequestInfo, EngineLoad, NodeReadQueue, GroupLoad, GroupTotal, DecodeFetchView,
                 GroupRouting, DecodeAssignment, DecodePlan, PendingPrefill, PrefillFetchView,
                 PrefillAssignment, PrefillPlan, BatchItem, BatchView, BatchEntry, BatchPlan):
        _fast_init(_cls)

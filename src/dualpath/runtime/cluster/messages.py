"""The one codec for control messages between client, scheduler and engines (msgspec msgpack).

Every message is a tagged frozen Struct; ``encode(msg) -> bytes`` and ``decode(bytes) -> Message``.
KV payloads never go through here: transports send them as raw frames next to a small header, and
what a PE and a DE tell each other about them goes as ``runtime/transfer/control.py``'s messages.

A request's read path is the policy's own ``ReadSide`` ("pe", "de", "split"), carried from the
scheduler's ``PrefillAssignment`` to both engines in one ``ReadPlan`` (``ReadPlan.of``).

Decoding validates every field (types, and the ranges below as ``msgspec.Meta`` constraints: ids
and counts >= 0, known roles, events and query kinds, ``tcp://``/``ipc://`` addresses, bounded
strings and lists) plus cross-field rules in ``__post_init__``; anything else raises
``msgspec.DecodeError`` / ``ValidationError`` (``DECODE_ERRORS``), which receivers count and drop
(``runtime/transfer/drops.py``). What needs the receiver's state (is this engine registered, is
this request assigned to it) is checked where the message is handled.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

import msgspec
from msgspec import Meta

from dualpath.policy.views import PrefillAssignment, ReadSide
from dualpath.runtime.cluster.api import (
    ClusterHealth,
    ClusterInfo,
    MetricsSnapshot,
    SamplingParams,
    StandbyHealth,
    TokenEvent,
)

DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError)
_I64 = 2**63 - 1
Count = Annotated[int, Meta(ge=0, le=_I64)]
EngineId = Annotated[int, Meta(ge=0, le=1 << 20)]
NodeId = Annotated[int, Meta(ge=0, le=1 << 20)]
RequestKey = Annotated[str, Meta(min_length=1, max_length=256)]
Text = Annotated[str, Meta(max_length=4096)]
TokenIds = Annotated[list[Annotated[int, Meta(ge=0, le=_I64)]], Meta(max_length=1 << 24)]
Address = Annotated[str, Meta(pattern=r"^(tcp://[^\s/]+:[0-9]{1,5}|ipc:///[^\s]+)$", max_length=512)]
Role = Literal["prefill", "decode"]
Counters = Annotated[dict[Annotated[str, Meta(max_length=128)], Count], Meta(max_length=4096)]
PeerMap = Annotated[dict[EngineId, Address], Meta(max_length=1 << 16)]


class _Msg(msgspec.Struct, frozen=True, kw_only=True, tag_field="t", tag=True):
    pass


# ----------------------------------------------------------------- client <-> scheduler
class Submit(_Msg, frozen=True):
    """A request. ``resubmitted``: its client submitted it to a scheduler that died (the client
    resubmits it to the restarted one, under a new id; it is not counted as a new request);
    ``generated``: the tokens the client had received by then (generation goes on after them,
    the next event has index ``len(generated)``)."""

    request_id: RequestKey
    prompt_token_ids: TokenIds
    params: SamplingParams
    api_key: Annotated[str, Meta(max_length=4096)] = ""  # the cluster's API key, where it has one
    resubmitted: bool = False
    generated: TokenIds = []

    def __post_init__(self) -> None:
        if self.generated and len(self.generated) >= self.params.max_tokens:
            raise ValueError(
                f"generated has {len(self.generated)} tokens; max_tokens={self.params.max_tokens} "
                "leaves none to generate"
            )


class Abort(_Msg, frozen=True):
    """End a request early: ``reason`` "cancelled" (its client went away: counted cancelled),
    "stop" (the client has what it wanted, e.g. a stop string matched: counted finished) or
    "failed" (the client gave up on the cluster, e.g. no token within its timeout: counted
    failed)."""

    request_id: RequestKey
    reason: Literal["cancelled", "stop", "failed"] = "cancelled"
    api_key: Annotated[str, Meta(max_length=4096)] = ""


class Query(_Msg, frozen=True):
    """``what``: "health" | "metrics" | "info"."""

    query_id: Count
    what: Literal["health", "metrics", "info"]


class QueryReply(_Msg, frozen=True):
    query_id: Count
    health: ClusterHealth | None = None
    metrics: MetricsSnapshot | None = None
    info: ClusterInfo | None = None
    error: Text | None = None


class Rejected(_Msg, frozen=True):
    """``kind``: "queue_full" | "too_long" | "unavailable" | "bad_request"."""

    request_id: RequestKey
    kind: Literal["queue_full", "too_long", "unavailable", "bad_request"]
    reason: Text


class Tokens(_Msg, frozen=True):
    """Token events, in order per request (DE -> scheduler -> client)."""

    events: Annotated[list[TokenEvent], Meta(max_length=1 << 16)]


# ----------------------------------------------------------------- engine <-> scheduler
class EngineHello(_Msg, frozen=True):
    """First message of an engine. ``engine_id`` -1 lets the scheduler choose."""

    engine_id: Annotated[int, Meta(ge=-1, le=1 << 20)]
    role: Role
    node_id: NodeId
    data_addr: Address
    pid: Count
    hbm_tokens: Count
    model_name: Annotated[str, Meta(max_length=1024)] = ""
    num_layers: Count = 0
    kv_bytes_per_token_layer: Count = 0
    block_size: Annotated[int, Meta(ge=1, le=1 << 20)] = 64
    vocab_size: Count = 0
    eos_token_id: Count | None = None
    max_context_len: Count = 0
    ready: bool = True  # False: registered but not routable until its EngineReady
    generation: Count = 0  # the incarnation of this engine id (a restart is a new one)
    weights_bytes: Count = 0
    kv_pool_bytes: Count = 0  # everything KV it allocates (runtime/cluster/memory.py)
    max_prompt_tokens: Count = 0  # the longest prompt its KV pool holds (0: no bound)
    max_context_tokens: Count = 0  # the longest prompt + generation (0: no bound)

    def geometry(self) -> tuple[object, ...]:
        """What every engine of one cluster must agree on (checked at each hello)."""
        return (
            self.model_name,
            self.num_layers,
            self.kv_bytes_per_token_layer,
            self.block_size,
            self.vocab_size,
            self.max_context_len,
        )


class EngineReady(_Msg, frozen=True):
    """The engine registered as ``engine_id`` has built its caches and worker: route to it now."""

    engine_id: EngineId
    pid: Count
    rss_bytes: Count = 0


class Welcome(_Msg, frozen=True):
    engine_id: EngineId
    is_leader: bool
    peers: PeerMap


class Peers(_Msg, frozen=True):
    """Data addresses of every live engine (sent when the set changes)."""

    peers: PeerMap


class Heartbeat(_Msg, frozen=True):
    """Periodic report. ``read_queue_tokens``: this engine's storage read backlog (the group leader's
    report of its node's ``read_q`` is what the scheduler uses); byte counters are cumulative."""

    engine_id: EngineId
    num_seqs: Count
    num_tokens: Count
    read_queue_tokens: Count
    bytes_by_path: Counters
    bytes_by_nic: Counters
    dropped: Counters = msgspec.field(default_factory=dict)  # DropCounter.snapshot() of the engine
    failed_requests: Count = 0  # requests this engine failed alone (per-request isolation)
    store_counts: Counters = msgspec.field(
        default_factory=dict
    )  # this engine's BlockStore: corrupt_blocks, evictions, ...
    store_write_errors: Counters = msgspec.field(
        default_factory=dict
    )  # its failed writes by cause ("ENOSPC", ...)
    rss_bytes: Count = 0  # the engine process's resident set now


class ReadPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Where a request's hit tokens (its first ``hit_len``, whole blocks) are read, as the policy
    planned it (``PrefillAssignment``): the first ``pe_read_len`` by the PE, the next
    ``de_read_len`` by the DE. ``side`` is the policy's ``ReadSide``: "pe" (``de_read_len`` 0; also
    a request without hits), "de" (``pe_read_len`` 0) or "split" (both); checked at decode."""

    side: ReadSide
    pe_read_len: Count
    de_read_len: Count

    def __post_init__(self) -> None:
        pe, de = self.pe_read_len > 0, self.de_read_len > 0
        want = "split" if pe and de else ("de" if de else "pe")
        if self.side != want:
            raise ValueError(
                f"read side {self.side!r} with pe_read_len={self.pe_read_len} and "
                f"de_read_len={self.de_read_len} (that is {want!r})"
            )

    @classmethod
    def of(cls, a: PrefillAssignment) -> ReadPlan:
        return cls(side=a.read_side, pe_read_len=a.pe_read_len, de_read_len=a.de_read_len)

    @property
    def hit_len(self) -> int:
        return self.pe_read_len + self.de_read_len


class PrefillTask(_Msg, frozen=True):
    """Prefill ``prompt_token_ids`` on this PE, its hits read as ``read`` says (the DE share
    arriving from DE ``decode_engine``). ``num_generated``: the last that many prompt tokens were
    generated by an earlier attempt of this request (it resumes after them), so the first token
    sampled here is the request's token ``num_generated`` (sampling step ``num_generated``)."""

    request_id: RequestKey
    prompt_token_ids: TokenIds
    read: ReadPlan
    decode_engine: EngineId
    params: SamplingParams
    num_generated: Count = 0

    def __post_init__(self) -> None:
        _check_task(self.prompt_token_ids, self.read, self.num_generated, self.params)


class DecodeTask(_Msg, frozen=True):
    """Receive this request's prompt KV (reading the DE share of ``read`` from the store and
    sending it to PE ``prefill_engine``), then decode (``num_generated``: see PrefillTask)."""

    request_id: RequestKey
    prompt_token_ids: TokenIds
    read: ReadPlan
    prefill_engine: EngineId
    params: SamplingParams
    num_generated: Count = 0  # as on PrefillTask: token events are indexed from it

    def __post_init__(self) -> None:
        _check_task(self.prompt_token_ids, self.read, self.num_generated, self.params)


class Progress(_Msg, frozen=True):
    """Lifecycle events from engines. ``event``: "read_done" (the engine's share of the hit read is
    in its buffer), "prefill_done" (PE side finished; ``hit_len``: prompt tokens whose KV was
    actually loaded and verified, which may be fewer than planned; ``first_token``: the token the
    PE sampled, which the scheduler streams to the client at once while the KV goes to the DE),
    "failed" (then ``error``)."""

    request_id: RequestKey
    engine_id: EngineId
    event: Literal["read_done", "prefill_done", "failed"]
    error: Text | None = None
    hit_len: Count | None = None
    first_token: Count | None = None


SETTINGS = ("policy", "read_free", "snic_gbps")  # what Configure sets (and ``reset`` names)


class Configure(_Msg, frozen=True):
    """Change operator settings (client -> scheduler -> engines); only when idle. A field left
    None keeps its current value; ``reset`` names settings to return to their defaults (policy
    "dualpath", read_free False, snic_gbps uncapped). The scheduler keeps the result across its
    restarts and sends it to every engine that registers; it answers with a QueryReply carrying
    health (``query_id`` echoes)."""

    query_id: Count
    policy: Annotated[str, Meta(min_length=1, max_length=64)] | None = None
    read_free: bool | None = None
    snic_gbps: Annotated[float, Meta(gt=0, le=1e6)] | None = None
    reset: Annotated[tuple[Literal["policy", "read_free", "snic_gbps"], ...], Meta(max_length=3)] = ()
    api_key: Annotated[str, Meta(max_length=4096)] = ""


class Cancel(_Msg, frozen=True):
    request_id: RequestKey


class Reset(_Msg, frozen=True):
    """The scheduler declared this engine dead (missed heartbeats) and has re-dispatched or failed
    its requests; the engine, still running, drops every task it holds and serves anew."""

    reason: Text = ""


class Shutdown(_Msg, frozen=True):
    reason: Text = ""


class EngineLoading(_Msg, frozen=True):
    """Sent by an engine's heartbeat thread while it loads (before its EngineHello), so that the
    scheduler reports it as loading and nobody takes it for dead (runtime/cluster/supervision.py)."""

    engine_id: Annotated[int, Meta(ge=-1, le=1 << 20)]
    role: Role
    node_id: NodeId
    pid: Count
    generation: Count = 0


class Supervision(_Msg, frozen=True):
    """The process supervisor's report to the scheduler (on each event and every second):
    ``restarts``: processes restarted per role ("scheduler", "prefill", "decode"); ``lost``:
    engine id -> pid of engine processes seen exiting and not yet back; ``down``: what the
    supervisor knows is down (a description -> since, Unix seconds); ``exited``: the latest exited
    pids per engine (each one death, counted once, registered or not); ``engine_restarts``:
    restarts per engine id; ``unhealthy``: why it stopped restarting; ``standby``: the spares."""

    restarts: Counters = msgspec.field(default_factory=dict)
    lost: Annotated[dict[EngineId, Count], Meta(max_length=1 << 16)] = msgspec.field(default_factory=dict)
    down: Annotated[
        dict[Annotated[str, Meta(max_length=256)], Annotated[float, Meta(ge=0)]], Meta(max_length=4096)
    ] = msgspec.field(default_factory=dict)
    exited: Annotated[
        dict[EngineId, Annotated[list[Count], Meta(max_length=64)]], Meta(max_length=1 << 16)
    ] = msgspec.field(default_factory=dict)  # engine id -> pids of its latest exited processes
    engine_restarts: Annotated[dict[EngineId, Count], Meta(max_length=1 << 16)] = msgspec.field(
        default_factory=dict
    )
    unhealthy: Text = ""  # why the supervisor gave up (a restart budget used up), "" otherwise
    given_up: Annotated[list[Annotated[str, Meta(max_length=256)]], Meta(max_length=4096)] = msgspec.field(
        default_factory=list
    )  # what it no longer restarts
    why: Annotated[dict[Annotated[str, Meta(max_length=256)], Text], Meta(max_length=4096)] = msgspec.field(
        default_factory=dict
    )  # what -> how its last process ended (e.g. "killed by SIGKILL; killed by the kernel's OOM killer")
    standby: Annotated[list[StandbyHealth], Meta(max_length=64)] = msgspec.field(default_factory=list)


Message = Union[  # noqa: UP007 (msgspec reads the tagged union from this alias)
    Submit,
    Abort,
    Query,
    QueryReply,
    Rejected,
    Tokens,
    EngineHello,
    Welcome,
    EngineReady,
    Peers,
    Heartbeat,
    PrefillTask,
    DecodeTask,
    Progress,
    Configure,
    Cancel,
    Reset,
    Shutdown,
    EngineLoading,
    Supervision,
]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes | memoryview) -> Message:
    """Decode and validate one message; raises one of ``DECODE_ERRORS`` on garbage."""
    return _decoder.decode(data)


def _check_task(ids: list[int], read: ReadPlan, num_generated: int, params: SamplingParams) -> None:
    """A task's hits lie inside a non-empty prompt; a resumed one (``num_generated``) keeps at
    least one prompt token of its own and has a token left to generate."""
    if not ids:
        raise ValueError("prompt_token_ids is empty")
    if num_generated >= len(ids) or num_generated >= params.max_tokens:
        raise ValueError(
            f"num_generated={num_generated} must be below the prompt length {len(ids)} and "
            f"max_tokens={params.max_tokens}"
        )
    if read.hit_len > len(ids):
        raise ValueError(
            f"read spans pe={read.pe_read_len} + de={read.de_read_len} exceed the prompt length {len(ids)}"
        )

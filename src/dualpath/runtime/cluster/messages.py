"""The one codec for control messages between client, scheduler and engines (msgspec msgpack).

Every message is a tagged frozen Struct; ``encode(msg) -> bytes`` and ``decode(bytes) -> Message``.
KV payloads never go through here: transports send them as raw frames next to a small header.
"""

from __future__ import annotations

from typing import Union

import msgspec

from dualpath.runtime.cluster.api import (
    ClusterHealth,
    ClusterInfo,
    MetricsSnapshot,
    SamplingParams,
    TokenEvent,
)


class _Msg(msgspec.Struct, frozen=True, kw_only=True, tag_field="t", tag=True):
    pass


# ----------------------------------------------------------------- client <-> scheduler
class Submit(_Msg, frozen=True):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


class Abort(_Msg, frozen=True):
    request_id: str


class Query(_Msg, frozen=True):
    """``what``: "health" | "metrics" | "info"."""

    query_id: int
    what: str


class QueryReply(_Msg, frozen=True):
    query_id: int
    health: ClusterHealth | None = None
    metrics: MetricsSnapshot | None = None
    info: ClusterInfo | None = None
    error: str | None = None


class Rejected(_Msg, frozen=True):
    """``kind``: "queue_full" | "too_long" | "unavailable" | "bad_request"."""

    request_id: str
    kind: str
    reason: str


class Tokens(_Msg, frozen=True):
    """Token events, in order per request (DE -> scheduler -> client)."""

    events: list[TokenEvent]


# ----------------------------------------------------------------- engine <-> scheduler
class EngineHello(_Msg, frozen=True):
    """First message of an engine. ``engine_id`` -1 lets the scheduler choose."""

    engine_id: int
    role: str
    node_id: int
    data_addr: str
    pid: int
    hbm_tokens: int
    model_name: str = ""
    num_layers: int = 0
    kv_bytes_per_token_layer: int = 0
    block_size: int = 64
    vocab_size: int = 0
    eos_token_id: int | None = None
    max_context_len: int = 0


class Welcome(_Msg, frozen=True):
    engine_id: int
    is_leader: bool
    peers: dict[int, str]


class Peers(_Msg, frozen=True):
    """Data addresses of every live engine (sent when the set changes)."""

    peers: dict[int, str]


class Heartbeat(_Msg, frozen=True):
    """Periodic report. ``read_queue_tokens``: this engine's storage read backlog (the group leader's
    report of its node's ``read_q`` is what the scheduler uses); byte counters are cumulative."""

    engine_id: int
    num_seqs: int
    num_tokens: int
    read_queue_tokens: int
    bytes_by_path: dict[str, int]
    bytes_by_nic: dict[str, int]
    store_counts: dict[str, int] = {}  # this engine's BlockStore: corrupt_blocks, evictions, ...
    store_write_errors: dict[str, int] = {}  # its failed writes by cause ("ENOSPC", ...)


class PrefillTask(_Msg, frozen=True):
    """Prefill ``prompt_token_ids`` on this PE; hits are the first ``hit_len`` tokens (whole blocks):
    the first ``pe_read_len`` read here, the rest (``de_read_len``) arrive from DE ``decode_engine``."""

    request_id: str
    prompt_token_ids: list[int]
    hit_len: int
    pe_read_len: int
    de_read_len: int
    decode_engine: int
    params: SamplingParams


class DecodeTask(_Msg, frozen=True):
    """Receive this request's prompt KV (reading ``de_read_len`` hit tokens after the first
    ``pe_read_len`` from the store and sending them to PE ``prefill_engine``), then decode."""

    request_id: str
    prompt_token_ids: list[int]
    hit_len: int
    pe_read_len: int
    de_read_len: int
    prefill_engine: int
    params: SamplingParams


class Progress(_Msg, frozen=True):
    """Lifecycle events from engines. ``event``: "read_done" (the engine's share of the hit read is
    in its buffer), "prefill_done" (PE side finished; ``hit_len``: prompt tokens whose KV was
    actually loaded and verified, which may be fewer than planned), "failed" (then ``error``)."""

    request_id: str
    engine_id: int
    event: str
    error: str | None = None
    hit_len: int | None = None


class Configure(_Msg, frozen=True):
    """Switch the policy and the Oracle switch (client -> scheduler -> engines); only when idle.
    The scheduler answers with a QueryReply carrying health (``query_id`` echoes)."""

    query_id: int
    policy: str
    read_free: bool = False
    snic_gbps: float | None = None  # None: keep the current storage-NIC cap


class Cancel(_Msg, frozen=True):
    request_id: str


class Reset(_Msg, frozen=True):
    """The scheduler declared this engine dead (missed heartbeats) and has re-dispatched or failed
    its requests; the engine, still running, drops every task it holds and serves anew."""

    reason: str = ""


class Shutdown(_Msg, frozen=True):
    reason: str = ""


Message = Union[
    Submit, Abort, Query, QueryReply, Rejected, Tokens, EngineHello, Welcome, Peers,
    Heartbeat, PrefillTask, DecodeTask, Progress, Configure, Cancel, Reset,
    Shutdown,
]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes | memoryview) -> Message:
    """Decode one message; raises msgspec.ValidationError / DecodeError on garbage."""
    return _decoder.decode(data)

"""Client-facing types of the cluster: what the HTTP layer (runtime/server/) and the demo code against.

Everything here is a frozen msgspec Struct, so the same objects cross process boundaries with the
one codec of :mod:`dualpath.runtime.cluster.messages`. No I/O happens here.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import msgspec

from dualpath.core.errors import DualpathError, require

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """How to generate. ``max_tokens`` is the number of tokens to generate (>= 1). The one sampling
    type: clients, the scheduler, the workers and the engines (``runtime.engine``) all take it.

    ``temperature`` 0 is greedy (deterministic); ``ignore_eos`` forces exactly ``max_tokens`` tokens
    (agent replay: the paper forces generation lengths). ``stop_token_ids`` end generation early
    (the EOS token is always a stop token unless ``ignore_eos``).
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        # Runs on construction and on every decode (msgspec), so a forged Submit is refused too.
        require(1 <= self.max_tokens <= INT64_MAX, "max_tokens", self.max_tokens, "must be >= 1")
        require(
            math.isfinite(self.temperature) and self.temperature >= 0.0,
            "temperature",
            self.temperature,
            "must be a finite number >= 0",
        )
        require(
            math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", self.top_p, "must be in (0, 1]"
        )
        require(
            self.seed is None or INT64_MIN <= self.seed <= INT64_MAX,
            "seed",
            self.seed,
            "must be a 64-bit signed integer",
        )
        for t in self.stop_token_ids:
            require(0 <= t <= INT64_MAX, "stop_token_ids", t, "must be token ids (>= 0)")

    def with_seed(self) -> SamplingParams:
        """These params with a seed: an unseeded request drawing tokens (temperature > 0) gets a
        fresh random one, once, so all its steps (and a re-dispatch or a resubmission) draw from
        one stream while two unseeded requests do not draw the same tokens."""
        if self.seed is not None or self.temperature == 0.0:
            return self
        import secrets

        return msgspec.structs.replace(self, seed=secrets.randbits(63))

    def ends_with(self, token_id: int, index: int, eos_token_id: int | None) -> bool:
        """Does generated token ``index`` (0-based), ``token_id``, end the request? At
        ``max_tokens`` tokens, on a stop token, or on EOS unless ``ignore_eos`` (the rule the
        decode engine stops by; the scheduler uses it to tell a final first token)."""
        if index + 1 >= self.max_tokens or token_id in self.stop_token_ids:
            return True
        return not self.ignore_eos and eos_token_id is not None and token_id == eos_token_id


class RequestStats(msgspec.Struct, frozen=True, kw_only=True):
    """Per-request accounting, attached to the last TokenEvent.

    Times are seconds since the scheduler received the request (``ttft_s``: first token left the
    prefill engine, streamed while its KV goes to the decode engine; ``ttst_s``: second token, or
    None). ``hit_len``: prompt tokens whose KV came from the store (of a request that resumed after
    an engine's death, of its last attempt's prompt: the prompt plus the tokens generated before);
    ``read_side``: "pe", "de", "split" or "none" (no hits); engine ids (of the last attempt) are
    cluster-wide.
    """

    prompt_len: int
    hit_len: int
    num_generated: int
    read_side: str
    prefill_engine: int
    decode_engine: int
    queue_s: float
    ttft_s: float
    ttst_s: float | None
    e2e_s: float


class TokenEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One generated token of one request, streamed in order (``index`` 0, 1, 2, ...).

    The last event of a request has ``finish_reason`` set: "length" (max_tokens reached), "stop"
    (stop/EOS token; that token is included) or "error" (then ``token_id`` is -1, ``error`` says
    why, e.g. an engine died). ``stats`` is set on the last event only.
    """

    request_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    index: Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
    token_id: Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)]
    finish_reason: Literal["length", "stop", "error"] | None = None
    error: Annotated[str, msgspec.Meta(max_length=4096)] | None = None
    stats: RequestStats | None = None

    @property
    def is_last(self) -> bool:
        return self.finish_reason is not None


class EngineHealth(msgspec.Struct, frozen=True, kw_only=True):
    """One engine, once, as it is now: ``state`` "ready" (routable), "starting" (registered,
    building its caches and worker), "loading" (its process loads the model), "dead" (declared
    dead: exited or silent), "restarting" (the supervisor starts it again) or "failed" (the
    supervisor gave up on it: its restart budget is used up); ``alive`` is
    ``state == "ready"``. ``pid`` / ``generation``: its current process and incarnation (a restart
    is a new generation); ``restarts``: times the supervisor restarted it. Memory (bytes, 0 where
    unknown): weights, the KV pool it allocated, its resident set at the last heartbeat; the
    longest prompt and context its pool holds."""

    engine_id: int
    role: str
    node_id: int
    alive: bool
    num_seqs: int
    num_tokens: int
    last_seen_s: float
    data_addr: str = ""  # the engine's transport address (its data plane)
    state: str = "ready"
    pid: int = 0
    generation: int = 0
    restarts: int = 0
    weights_bytes: int = 0
    kv_pool_bytes: int = 0
    rss_bytes: int = 0
    max_prompt_tokens: int = 0
    max_context_tokens: int = 0


class StandbyHealth(msgspec.Struct, frozen=True, kw_only=True):
    """A spare engine process: ``warm`` once its model is loaded (only then is it used)."""

    pid: int
    warm: bool
    rss_bytes: int = 0


class DownItem(msgspec.Struct, frozen=True, kw_only=True):
    """A process not serving now: ``state`` "dead" (declared dead or exited), "restarting" (the
    supervisor restarts it), "loading" (started, not registered yet), "starting" (registered,
    building its caches) or "failed" (its restart budget is used up: not restarted); since
    ``since_unix_s``."""

    what: str  # e.g. "decode engine 2"
    state: Literal["dead", "restarting", "loading", "starting", "failed"]
    since_unix_s: float


class ClusterHealth(msgspec.Struct, frozen=True, kw_only=True):
    """``ok`` is True when a request sent now will be served: at least one prefill and one decode
    engine ready and no ``reason`` to be unhealthy; ``unavailable`` lists what is down now
    (non-empty while ok: degraded) and ``down`` names it; history is in the logs and metrics."""

    ok: bool
    engines: tuple[EngineHealth, ...]
    num_waiting: int
    num_running: int
    policy: str
    down: tuple[str, ...] = ()
    unavailable: tuple[DownItem, ...] = ()
    restarts: dict[str, int] = msgspec.field(default_factory=dict)  # role -> processes restarted
    reason: str = ""  # why the cluster is unhealthy (e.g. a restart budget used up), "" otherwise
    standby: tuple[StandbyHealth, ...] = ()


class ClusterInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What the HTTP layer needs to validate requests and name the model."""

    model_name: str
    max_context_len: int
    vocab_size: int
    eos_token_id: int | None
    max_queued_requests: int
    block_size: int


class MetricsSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Counters since start. ``bytes_by_path``: "pe-read", "de-read", "pd-transfer", "persist";
    ``bytes_by_nic``: e.g. "node0/snic", "engine2/cnic" (bytes through each emulated NIC);
    ``ttft_s`` / ``ttst_s`` / ``tpot_s`` / ``e2e_s``: raw samples of finished requests (bounded,
    most recent last) for histograms; ``queue_depths``: "waiting", "prefill_queue", "decode_queue".
    Engine liveness: live engines per role, deaths declared and revivals since start.
    ``hit_tokens``: prompt tokens whose KV was loaded from the store and verified.
    """

    num_requests: int
    num_finished: int
    num_failed: int
    hit_tokens: int
    prompt_tokens: int
    generated_tokens: int
    bytes_by_path: dict[str, int]
    bytes_by_nic: dict[str, int]
    queue_depths: dict[str, int]
    ttft_s: list[float]
    ttst_s: list[float]
    tpot_s: list[float]
    e2e_s: list[float]
    engines_alive: dict[str, int] = msgspec.field(default_factory=dict)  # role -> live engines
    engine_deaths: int = 0  # engines declared dead (missed heartbeats)
    engine_revivals: int = 0  # of those, taken back (Reset) when they answered again
    # KV store, summed over every process's store: "corrupt_blocks" (failed verification,
    # quarantined), "evictions", "rewritten_blocks" (healed), "written_blocks",
    # "failed_hit_tokens" (planned hits that did not load; recomputed, not in hit_tokens)
    store_counts: dict[str, int] = msgspec.field(default_factory=dict)
    store_write_errors: dict[str, int] = msgspec.field(default_factory=dict)  # cause -> count
    messages_dropped: dict[str, int] = msgspec.field(default_factory=dict)  # "plane/cause" -> n
    engine_request_failures: int = 0  # requests an engine failed alone (others served on)
    process_restarts: dict[str, int] = msgspec.field(default_factory=dict)  # role -> restarts (supervisor)
    requests_retried: int = 0  # requests re-dispatched (resumed) after their engine was lost
    num_cancelled: int = 0  # requests whose client went away before they finished


class ClusterError(DualpathError):
    """The cluster refused or lost a request."""


class QueueFullError(ClusterError):
    """The scheduler's queue is full (HTTP 429)."""


class ContextTooLongError(ClusterError):
    """prompt + max_tokens exceeds the model's context (HTTP 400)."""


class ClusterUnavailableError(ClusterError):
    """No scheduler answered, or no engine of a needed role is alive (HTTP 503)."""

"""ClusterConfig: one frozen, validated description of a cluster (no I/O on construction).

It composes the three configs the processes read, each knob and its default defined once, here:
:class:`SchedulerServiceConfig` (the scheduler service), :class:`EngineConfig` (every engine) and
:class:`TrafficConfig` (the emulated NICs). The process arguments (``SchedulerArgs``,
``EngineArgs``) carry these sections whole, with no renamed or re-unitted copies.
"""

from __future__ import annotations

import msgspec

from dualpath.core.errors import require
from dualpath.core.links import SNIC_DIRECTIONS
from dualpath.core.registry import lookup
from dualpath.policy.config import COMPUTE_QUOTA_S, check_scheduler_options
from dualpath.policy.scheduler import POLICIES
from dualpath.runtime.choices import DTYPES, KV_BACKEND_NAMES, TRANSPORT_NAMES
from dualpath.runtime.cluster.memory import AUTO, parse_memory
from dualpath.runtime.kvstore.limits import check_file_mode
from dualpath.spec.clusters import DEFAULT_RUNTIME_MODEL

DEFAULT_POLICY = "dualpath"
# Prompt tokens/s one PE is assumed to prefill when none is configured (beta = 5 s of it). Cached
# tokens dominate prompts in agentic turns and cost little compute, hence the generous values.
PREFILL_TOKENS_PER_S: dict[str, float] = {"tiny": 200_000.0}
PREFILL_TOKENS_PER_S_OTHER = 20_000.0


class TrafficConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The emulated NICs (``traffic.py``; the link model of ``dualpath.core.links``).

    ``snic_gbps`` caps each node's storage NIC (per direction when ``snic_directions`` is
    "duplex": reads in, persists out; one link for both when "shared"); ``cnic_gbps`` each
    engine's compute NIC (KV between engines); None = uncapped. ``read_free`` bypasses
    storage-read and PD-transfer costs (the paper's Oracle).
    """

    snic_gbps: float | None = None
    cnic_gbps: float | None = None
    snic_directions: str = "duplex"
    read_free: bool = False

    def __post_init__(self) -> None:
        for key in ("snic_gbps", "cnic_gbps"):
            val = getattr(self, key)
            require(val is None or val > 0, key, val, "must be > 0 (or omitted for no cap)")
        require(
            self.snic_directions in SNIC_DIRECTIONS,
            "snic_directions",
            self.snic_directions,
            f"choices: {', '.join(SNIC_DIRECTIONS)}",
        )


class SchedulerServiceConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The scheduler service's knobs.

    ``prefill_tokens_per_s``: the PE prefill rate behind beta (None: ``PREFILL_TOKENS_PER_S`` of
    the model). ``storage_read_gbps``: a node's storage read rate behind alpha when the SNIC is
    uncapped (None: the scheduler measures the store's read rate at start; a capped SNIC's rate
    is its cap). ``engine_timeout_s``: silence after which an engine counts as dead;
    ``left_grace_s``: how long a dead engine nobody restarts stays listed (then it left).
    ``pe_scope`` / ``read_tie`` / ``pe_tie``: the policy's PE scope (None: the policy's own) and the
    two tie-breaks of spec section 8, as in ``SchedulerConfig`` (docs/policy.md).
    """

    prefill_tokens_per_s: float | None = None
    storage_read_gbps: float | None = None
    max_queued_requests: int = 256
    engine_timeout_s: float = 5.0
    left_grace_s: float = 60.0
    tick_s: float = 0.002
    pe_scope: str | None = None
    read_tie: str = "pe"
    pe_tie: str = "group"

    def __post_init__(self) -> None:
        for key in ("prefill_tokens_per_s", "storage_read_gbps"):
            val = getattr(self, key)
            require(val is None or val > 0, key, val, "must be > 0 (or omitted)")
        require(
            self.max_queued_requests >= 1, "max_queued_requests", self.max_queued_requests, "must be >= 1"
        )
        require(self.engine_timeout_s > 0, "engine_timeout_s", self.engine_timeout_s, "must be > 0")
        require(self.left_grace_s > 0, "left_grace_s", self.left_grace_s, "must be > 0")
        require(self.tick_s > 0, "tick_s", self.tick_s, "must be > 0")
        check_scheduler_options(self.pe_scope, self.read_tie, self.pe_tie)

    def policy_overrides(self) -> dict[str, str | None]:
        """The ``SchedulerConfig`` fields this section sets."""
        return {"pe_scope": self.pe_scope, "read_tie": self.read_tie, "pe_tie": self.pe_tie}

    def beta_rate(self, model: str) -> float:
        """Prompt tokens/s one PE is assumed to prefill (policy beta = 5 s of it)."""
        if self.prefill_tokens_per_s is not None:
            return self.prefill_tokens_per_s
        return PREFILL_TOKENS_PER_S.get(model, PREFILL_TOKENS_PER_S_OTHER)


QUOTA_SCOPES = ("forward", "attention")  # what a PE's compute quota bounds (EngineConfig.quota_scope)


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Every engine's knobs.

    ``compute_quota_s`` caps a PE batch's predicted time per forward pass under the dualpath
    policies' quota batching (300 ms, the paper's number). ``quota_scope`` says what is predicted:
    "forward" (default: the whole forward, measured by each PE at start on its own device,
    ``runtime/engine/profile.forward_predictor``, so one batch holds the PE for about one quota
    whatever dominates it) or "attention" (the paper's: attention time only, which on a 1-thread CPU
    is a small part of a forward; docs/cluster.md). ``attention_s_per_gflop`` > 0 fixes an attention
    line instead of measuring (with ``attention_intercept_s`` per forward; deterministic tests). The
    baselines batch by ``max_batch_tokens`` new tokens.
    ``kv_cache_memory``: each engine's KV memory (``--kv-cache-memory``: bytes such as "512MiB",
    a fraction <= 1 of the available memory, or "auto"; ``runtime/cluster/memory.py`` says how it is
    split and what it holds); ``heartbeat_s``: load report period.
    """

    block_size: int = 64
    dtype: str = "float32"
    kv_cache_memory: str = AUTO
    compute_quota_s: float = COMPUTE_QUOTA_S
    quota_scope: str = "forward"
    attention_s_per_gflop: float = 0.0  # 0: each PE profiles its predictor at start
    attention_intercept_s: float = 0.0
    max_batch_tokens: int = 2048
    heartbeat_s: float = 0.2

    def __post_init__(self) -> None:
        require(self.block_size >= 1, "block_size", self.block_size, "must be >= 1")
        require(self.dtype in DTYPES, "dtype", self.dtype, f"choices: {', '.join(DTYPES)}")
        parse_memory(self.kv_cache_memory)
        require(self.compute_quota_s > 0, "compute_quota_s", self.compute_quota_s, "must be > 0")
        require(self.quota_scope in QUOTA_SCOPES, "quota_scope", self.quota_scope,
                f"choices: {', '.join(QUOTA_SCOPES)}")  # fmt: skip
        require(
            self.attention_s_per_gflop >= 0,
            "attention_s_per_gflop",
            self.attention_s_per_gflop,
            "must be >= 0 (0 = measure at start)",
        )
        require(
            self.attention_intercept_s >= 0,
            "attention_intercept_s",
            self.attention_intercept_s,
            "must be >= 0",
        )
        require(self.max_batch_tokens >= 1, "max_batch_tokens", self.max_batch_tokens, "must be >= 1")
        require(self.heartbeat_s > 0, "heartbeat_s", self.heartbeat_s, "must be > 0")


class SupervisorConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A local cluster's process supervisor (``supervisor.py``, its own process).

    ``standby``: warm spare engine processes (model loaded) a restart takes instead of starting
    cold; 0 keeps none. Restarts wait ``first_backoff_s``, doubling while a process keeps dying
    within ``stable_s`` of its start, at most ``max_backoff_s`` (at least ``oom_backoff_s`` after
    the kernel's OOM killer took it). ``restart_burst`` restarts of one process within
    ``restart_interval_s`` (systemd's ``StartLimitBurst`` / ``StartLimitIntervalSec``: 5 in 10 s
    for units restarting in 100 ms; an engine restart here takes seconds, so 5 in 60 s) and it is
    not restarted again: the cluster reports itself unhealthy with the reason. A scheduler that
    answers no health query for ``hung_s``, or an engine process the scheduler holds dead (or has
    not heard of since its start) for ``hung_s``, is killed and restarted. ``poll_s``: how often
    children are checked; ``report_s``: how often the scheduler gets a report.
    """

    standby: int = 0
    restart_burst: int = 5
    restart_interval_s: float = 60.0
    first_backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    oom_backoff_s: float = 5.0
    stable_s: float = 30.0
    hung_s: float = 20.0
    poll_s: float = 0.1
    report_s: float = 1.0

    def __post_init__(self) -> None:
        require(0 <= self.standby <= 16, "standby", self.standby, "must be in [0, 16]")
        require(self.restart_burst >= 1, "restart_burst", self.restart_burst, "must be >= 1")
        for key in ("restart_interval_s", "first_backoff_s", "max_backoff_s", "stable_s", "hung_s",
                    "poll_s", "report_s"):  # fmt: skip
            require(getattr(self, key) > 0, key, getattr(self, key), "must be > 0")
        require(self.oom_backoff_s >= 0, "oom_backoff_s", self.oom_backoff_s, "must be >= 0")


class ClusterConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A local or multi-host cluster.

    Engines are numbered: prefill engines 0..P-1, then decode engines P..P+D-1. Each emulated node
    holds ``engines_per_node`` engines of one role (one engine group per node, rank 0 leads); nodes
    are numbered prefill first. ``model`` is a name from dualpath.spec ("smollm2-135m") or "tiny"
    (a small random model); ``policy`` a key of ``dualpath.policy.POLICIES``; ``transport`` one of
    ``TRANSPORT_NAMES``. ``kv_capacity_gb`` caps the KV store (default: 90% of the file system's
    free space at start; each of the D decode engines, the writers, bounds its index at 1/D of
    it); ``kv_file_mode`` sets the block files' permission bits (0600; 0640 for a group sharing
    the directory). ``kv_backend`` (``KV_BACKEND_NAMES``, docs/kvstore.md) is where the blocks
    live: ``posix`` (``kv_dir``, the default), ``nixl-posix`` (``kv_dir``, bytes moved by NIXL),
    ``mooncake`` (Mooncake Store at ``kv_mooncake_master`` / ``kv_mooncake_metadata``; a local
    cluster with these empty starts a store of its own). ``api_key_sha256``: where set, the scheduler takes requests, aborts and
    settings only with that key (``sched_guard.py``; ``dualpath serve --api-key`` sets it).
    ``scheduler``, ``engine``, ``traffic``, ``supervisor``: the sections above.
    """

    kv_dir: str
    model: str = DEFAULT_RUNTIME_MODEL
    policy: str = DEFAULT_POLICY
    num_prefill_engines: int = 1
    num_decode_engines: int = 2
    engines_per_node: int = 1
    transport: str = "zmq"
    host: str = "127.0.0.1"
    scheduler_port: int = 0
    seed: int = 0
    kv_capacity_gb: float | None = None  # None: 90% of the free space at start (see kvstore)
    kv_file_mode: int = 0o600  # block files; 0o640 lets a shared-FS group read them
    kv_backend: str = "posix"
    kv_mooncake_master: str = ""  # host:port of mooncake_master's RPC ("": a local cluster starts one)
    kv_mooncake_metadata: str = ""  # its HTTP metadata server, http://host:port/metadata
    api_key_sha256: str = ""  # sha256 hex of the API key: Submit / Abort / Configure must carry it
    scheduler: SchedulerServiceConfig = msgspec.field(default_factory=SchedulerServiceConfig)
    engine: EngineConfig = msgspec.field(default_factory=EngineConfig)
    traffic: TrafficConfig = msgspec.field(default_factory=TrafficConfig)
    supervisor: SupervisorConfig = msgspec.field(default_factory=SupervisorConfig)

    def __post_init__(self) -> None:
        require(self.kv_dir != "", "kv_dir", self.kv_dir, "must name a directory")
        require(self.model != "", "model", self.model, "must name a model")
        lookup(POLICIES, self.policy, "policy")
        require(
            self.kv_capacity_gb is None or self.kv_capacity_gb > 0,
            "kv_capacity_gb",
            self.kv_capacity_gb,
            "must be > 0 (or omitted: 90% of the free space at start)",
        )
        check_file_mode(self.kv_file_mode)
        lookup(dict.fromkeys(KV_BACKEND_NAMES), self.kv_backend, "kv_backend")
        require(
            bool(self.kv_mooncake_master) == bool(self.kv_mooncake_metadata),
            "kv_mooncake_master",
            self.kv_mooncake_master or "(empty)",
            "and kv_mooncake_metadata are given together (the master's RPC and its metadata URL)",
        )
        require(
            self.num_prefill_engines >= 1, "num_prefill_engines", self.num_prefill_engines, "must be >= 1"
        )
        require(self.num_decode_engines >= 1, "num_decode_engines", self.num_decode_engines, "must be >= 1")
        require(self.engines_per_node >= 1, "engines_per_node", self.engines_per_node, "must be >= 1")
        lookup(dict.fromkeys(TRANSPORT_NAMES), self.transport, "transport")
        require(
            0 <= self.scheduler_port < 65536,
            "scheduler_port",
            self.scheduler_port,
            "must be a TCP port (0 = any free port)",
        )
        require(
            self.scheduler.engine_timeout_s > 2 * self.engine.heartbeat_s,
            "scheduler.engine_timeout_s",
            self.scheduler.engine_timeout_s,
            f"must exceed two heartbeats (engine.heartbeat_s = {self.engine.heartbeat_s})",
        )

    @property
    def num_engines(self) -> int:
        return self.num_prefill_engines + self.num_decode_engines

    def role_of(self, engine_id: int) -> str:
        return "prefill" if engine_id < self.num_prefill_engines else "decode"

    def node_of(self, engine_id: int) -> int:
        """Emulated node of an engine: PEs fill nodes 0.., DEs the nodes after the last PE node."""
        per = self.engines_per_node
        num_pe_nodes = -(-self.num_prefill_engines // per)
        if engine_id < self.num_prefill_engines:
            return engine_id // per
        return num_pe_nodes + (engine_id - self.num_prefill_engines) // per

    @property
    def num_nodes(self) -> int:
        return self.node_of(self.num_engines - 1) + 1


class SchedulerArgs(msgspec.Struct, frozen=True, kw_only=True):
    """The scheduler process: the cluster's config (``scheduler``, ``traffic`` sections, policy,
    KV store) plus what only this process has. It binds ``tcp://<cluster.host>:<scheduler_port>``."""

    cluster: ClusterConfig
    port_file: str = ""  # if set, the bound address is written here
    kv_capacity_bytes: int | None = None  # None: 90% of the free space at start (see kvstore)
    key_file: str = ""  # cluster CURVE keys (runtime/transfer/auth.py); "" = unauthenticated
    state_file: str = ""  # settings and counters kept across scheduler restarts (sched_persist.py)
    supervised: bool = False  # started by a supervisor: counts as supervised until its first report

    @property
    def bind(self) -> str:
        return f"tcp://{self.cluster.host}:{self.cluster.scheduler_port}"


class EngineArgs(msgspec.Struct, frozen=True, kw_only=True):
    """One engine process: the cluster's config (``engine``, ``traffic`` sections, model, policy,
    transport, KV store; ``cluster.host`` is the address peers reach this engine's transport at)
    plus what only this process has (``dualpath engine`` flags map onto these)."""

    cluster: ClusterConfig
    scheduler: str  # "tcp://host:port"
    role: str
    node_id: int
    engine_id: int = -1
    cluster_id: str = "default"
    kv_capacity_bytes: int | None = None  # None: 90% of the free space at start (see kvstore)
    key_file: str = ""  # cluster CURVE keys (runtime/transfer/auth.py); "" = unauthenticated
    weights_dir: str = ""  # packed weights shared by this host's engines (model/packed.py); "" = own copy
    generation: int = 0  # this engine id's incarnation (the supervisor counts its restarts)
    id_file: str = ""  # if set, the engine id the scheduler gave is written here (engine_keeper.py)


# ``dualpath demo``: system name -> (policy, read_free).
DEMO_SYSTEMS: dict[str, tuple[str, bool]] = {
    "basic": ("basic", False),
    "dualpath": ("dualpath", False),
    "oracle": ("dualpath", True),
    "rr-shorter-queue": ("rr-shorter-queue", False),
    "always-de": ("always-de", False),
    "dualpath-split": ("dualpath-split", False),
}
# Demo storage-NIC caps (Gbit/s) per model so that reading a turn's cached context takes a few
# times longer than computing its append on a 2-core CPU (KV: SmolLM2 46 KB/token fp32, tiny 2 KB).
DEMO_SNIC_GBPS: dict[str, float] = {DEFAULT_RUNTIME_MODEL: 0.1, "tiny": 0.01}


class DemoConfig(msgspec.Struct, frozen=True, kw_only=True):
    """``dualpath demo`` (runtime/cluster/demo.py): the same agents under each system on one local
    cluster. ``snic_gbps`` None: ``DEMO_SNIC_GBPS`` of the model."""

    model: str = DEFAULT_RUNTIME_MODEL
    systems: tuple[str, ...] = ("basic", "dualpath", "oracle")
    num_prefill_engines: int = 1
    num_decode_engines: int = 2
    num_agents: int = 6
    max_turns: int = 6
    scale: float = 1 / 16
    max_len: int = 2048
    snic_gbps: float | None = None
    cnic_gbps: float | None = None
    transport: str = "zmq"
    kv_backend: str = "posix"
    kv_dir: str = ""
    seed: int = 0

    def __post_init__(self) -> None:
        for s in self.systems:
            lookup(DEMO_SYSTEMS, s, "system")
        require(self.num_agents >= 1, "num_agents", self.num_agents, "must be >= 1")
        require(self.max_turns >= 1, "max_turns", self.max_turns, "must be >= 1")
        require(0 < self.scale <= 1, "scale", self.scale, "must be in (0, 1]")
        lookup(dict.fromkeys(TRANSPORT_NAMES), self.transport, "transport")
        lookup(dict.fromkeys(KV_BACKEND_NAMES), self.kv_backend, "kv_backend")

    @property
    def snic(self) -> float:
        return self.snic_gbps if self.snic_gbps is not None else DEMO_SNIC_GBPS.get(self.model, 0.1)

"""The local cluster (``dualpath simulate --cluster local``): our own ``dualpath serve`` 1PnD cluster
on one machine, as the simulator's hardware.

A :class:`LocalClusterSpec` says what the runtime's local cluster is made of, each value the
runtime's own default (``runtime/cluster/config.py`` and the workers; ``tests/sim/
test_local_cluster.py`` holds them equal, since the simulator may not import the runtime): one
engine process per emulated node, prefill nodes first; each node's storage NIC capped at
``snic_gbps`` (reads in, persists out on its other direction: ``TrafficConfig.snic_directions``
"duplex"), each engine's compute NIC at ``cnic_gbps`` (None: uncapped, as ``dualpath demo``
runs); each engine's KV pools (the PE's buffer and staging slots, the DE's buffer and paged
cache, which is also the room the scheduler books a DE for) split from its ``--kv-cache-memory``
budget by the runtime's own rule (``spec/kv_pools.py``; ``kv_cache_bytes`` None: ``auto``, the
runtime's default, for the profiled model's KV); 64-token blocks; the scheduler's 2 ms fetch tick; beta from the runtime's prefill rate, alpha from the SNIC
cap. Step times come from a measured engine profile (``--device profile:FILE``,
``spec/engine_profile.py``, ``cost/profile.py``), not from a GPU: the engines are CPU processes.

What the runtime does that the paper's cluster model does differently, and the simulator follows
under this cluster (``Simulation``'s local mode; docs/sim.md "Local cluster"):

- fetches run in the runtime's order (``policy.fetch.RUNTIME_ORDER``: every 2 ms tick, the first
  DE group drains the global queue, every group fetches, no PE rotation); a task reaches its
  engine at once, and the engine takes it between its steps, which is when its reads start (PE
  read path: the PE's next step boundary; DE read path: the DE's);
- every policy runs the same layerwise engine (the runtime has no whole-prompt Basic), and Oracle
  is ``TrafficConfig.read_free``: storage reads and PD transfers cost nothing, persists do;
- a request's last token reaches its client only after its persists (the DE's writer thread
  emits it after them, so the next turn finds its blocks); the first token reaches it with the
  second, at the end of the DE's first step with the request (the DE sends a step's tokens after
  the step);
- the fixed costs of the paper's cluster (``LOCAL_CALIBRATION``) are zero: what the engine's
  loop spends is inside the measured steps and the measured admission of a prefilled prompt;
- the engines are processes of one machine: while more of them compute than it has cores, each
  runs at cores / computing of its profiled speed (``sim.decode.CpuShare``; the cores are the
  profiled machine's, ``EngineProfile.cpu_cores``).
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.core.errors import require
from dualpath.core.units import gbps_to_bytes_per_s
from dualpath.sim.calibration import Calibration
from dualpath.spec.engine_profile import EngineProfile
from dualpath.spec.kv_pools import KVPools, auto_budget_bytes, size_pools

# The runtime's defaults (tests/sim/test_local_cluster.py checks each against the runtime):
FETCH_TICK_S = 0.002  # SchedulerServiceConfig.tick_s
BLOCK_SIZE = 64  # EngineConfig.block_size
COMPUTE_QUOTA_S = 0.3  # EngineConfig.compute_quota_s
MAX_BATCH_TOKENS = 2048  # EngineConfig.max_batch_tokens (the baselines' token budget)
PREFILL_TOKENS_PER_S = 20_000.0  # config.PREFILL_TOKENS_PER_S_OTHER (beta = 5 s of it)
# ``dualpath demo``'s agents (DemoConfig): the default workload of ``simulate --cluster local``
DEMO_AGENTS = 6
DEMO_TURNS = 6
DEMO_SCALE = 1 / 16
DEMO_MAX_LEN = 2048
DEMO_SNIC_GBPS = 0.1  # DEMO_SNIC_GBPS of SmolLM2

# The local cluster's constants: the paper cluster's fixed costs do not exist here, or are inside
# the measured engine steps (each reason below). Not fitted to anything.
LOCAL_CALIBRATION = Calibration(
    fetch_interval_s=FETCH_TICK_S,  # the runtime scheduler's tick
    storage_efficiency=1.0,  # an emulated SNIC delivers its cap (core.links FIFO at the rate)
    de_output_reserve=0.0,  # a DE reserves the whole prompt at admission (DecodeEngine.reserve)
    storage_read_latency_s=0.0,  # the block files are read while the read's link time runs
    buffer_alloc_s=0.0,  # preallocated buffers: a few list operations
    pd_handoff_s=0.0,  # PrefillDone rides the KV's transport FIFO; the DE's boundary wait is modelled
    pd_layer_handoff_s=0.0,  # each layer's loads and sends are inside the measured PE step
    decode_join_s=0.0,  # the profile's measured admission of a prefilled prompt replaces it
    hbm_usable_fraction=1.0,  # (unused: the DE's room is its paged cache, spec/kv_pools.py)
    prefill_iter_overhead_s=0.0,  # inside the measured step
    decode_step_overhead_s=0.0,  # inside the measured step
    ep_layer_latency_rdma_s=0.0,  # no expert parallelism
    ep_layer_latency_nvlink_s=0.0,
    compute_quota_per_forward_s=COMPUTE_QUOTA_S,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalClusterSpec:
    """The local cluster (module docstring). ``snic_gbps``: each node's storage-NIC cap (Gbit/s;
    the scheduler's alpha and the links' rate); ``cnic_gbps``: each engine's compute NIC (None:
    uncapped); ``cpu_cores``: the cores its engine processes share (None: those of the machine the
    profile was measured on, ``EngineProfile.cpu_cores``); ``background_threads``: the mean number
    of other runnable threads on that machine while it runs (0: a quiet machine; a shared one's
    can be measured, as ``benchmarks/sim_vs_serve.py`` does); ``kv_cache_bytes``: each engine's KV
    budget (``--kv-cache-memory`` in bytes; None: ``auto``, the runtime's default)."""

    num_prefill_engines: int = 1
    num_decode_engines: int = 2
    snic_gbps: float = DEMO_SNIC_GBPS
    cnic_gbps: float | None = None
    snic_directions: str = "duplex"  # TrafficConfig.snic_directions
    cpu_cores: float | None = None  # the cores the engines share (None: the profile's machine's)
    background_threads: float = 0.0  # runnable threads of other work on the machine (mean)
    kv_cache_bytes: int | None = None  # EngineConfig.kv_cache_memory (None: "auto")

    def __post_init__(self) -> None:
        require(self.num_prefill_engines >= 1, "num_prefill_engines", self.num_prefill_engines, ">= 1")
        require(self.num_decode_engines >= 1, "num_decode_engines", self.num_decode_engines, ">= 1")
        require(self.snic_gbps > 0, "snic_gbps", self.snic_gbps, "must be > 0 (the local cluster caps it)")
        require(self.cnic_gbps is None or self.cnic_gbps > 0, "cnic_gbps", self.cnic_gbps, "> 0 or None")
        require(self.cpu_cores is None or self.cpu_cores > 0, "cpu_cores", self.cpu_cores, "> 0 or None")
        require(self.background_threads >= 0, "background_threads", self.background_threads, ">= 0")
        require(
            self.kv_cache_bytes is None or self.kv_cache_bytes > 0,
            "kv_cache_bytes",
            self.kv_cache_bytes,
            "> 0",
        )

    @property
    def name(self) -> str:
        return f"local-{self.num_prefill_engines}p{self.num_decode_engines}d"

    @property
    def pd_label(self) -> str:
        return f"{self.num_prefill_engines}P{self.num_decode_engines}D"

    @property
    def snic_bytes_per_s(self) -> float:
        return gbps_to_bytes_per_s(self.snic_gbps)

    @property
    def cnic_bytes_per_s(self) -> float:
        return float("inf") if self.cnic_gbps is None else gbps_to_bytes_per_s(self.cnic_gbps)

    def budget_bytes(self, profile: EngineProfile) -> int:
        """One engine's KV budget for the profiled model (``memory.resolve_memory``)."""
        return (
            self.kv_cache_bytes
            if self.kv_cache_bytes is not None
            else auto_budget_bytes(profile.kv_bytes_per_token)
        )

    def kv_pools(self, profile: EngineProfile) -> tuple[KVPools, KVPools]:
        """The PE's and a DE's KV pools, as ``engine_setup.engine_pools`` splits them (the model's
        geometry from the profile; its longest context is ``max_context_len``, 0 in profiles made
        before it was recorded: then the PE staging share alone, as for any model whose share
        exceeds its context)."""
        geo = {
            "block_size": profile.block_size,
            "block_bytes": profile.kv_bytes_per_token * profile.block_size,
            "num_layers": profile.num_layers,
            "max_context": profile.max_context_len,
        }
        budget = self.budget_bytes(profile)
        return size_pools("prefill", budget, **geo), size_pools("decode", budget, **geo)


def parse_local(text: str) -> bool:
    """Whether a ``--cluster`` value names the local cluster."""
    return text.strip().lower() == "local"

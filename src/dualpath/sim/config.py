"""Simulator configuration: which systems exist and one frozen config per run.

A *system* (spec section 9 plus the ablation) is a policy name from ``dualpath.policy`` plus a
load path from ``sim/load_path.py`` (layerwise, Basic's whole prompt, Oracle's free I/O): the
mechanism. The decisions stay in the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dualpath.core.errors import require
from dualpath.core.links import SNIC_DIRECTIONS
from dualpath.core.registry import lookup
from dualpath.cost.factory import COST_MODEL_NAMES
from dualpath.policy.config import check_scheduler_options
from dualpath.sim.calibration import DEFAULT_CALIBRATION, Calibration

# ``SimConfig.cost_model``: a dualpath.cost model, or auto (calibrated if its tables can be read)
SIM_COST_MODELS = ("auto", *COST_MODEL_NAMES)
PE_FETCHES = ("tick", "boundary")  # SimConfig.pe_fetch

if TYPE_CHECKING:
    from dualpath.sim.local import LocalClusterSpec
    from dualpath.spec.clusters import ClusterPreset
    from dualpath.spec.engine_profile import EngineProfile


@dataclass(frozen=True, slots=True, kw_only=True)
class SystemSpec:
    """``policy``: scheduler name in ``dualpath.policy``; ``load_path``: a name in
    ``sim.load_path.LOAD_PATHS``: ``layerwise`` (per-layer KV load overlapped with compute),
    ``whole-prompt`` (Basic's whole-prompt KV in PE HBM), ``free-io`` (storage reads, host-device
    copies and PD transfers take zero time: Oracle)."""

    name: str
    policy: str
    load_path: str = "layerwise"

    def __post_init__(self) -> None:
        from dualpath.sim.load_path import load_path_class

        load_path_class(self.load_path)  # an unknown name fails here, with the choices


SYSTEMS: dict[str, SystemSpec] = {
    s.name: s
    for s in (
        SystemSpec(name="basic", policy="basic", load_path="whole-prompt"),
        SystemSpec(name="layerwise", policy="basic"),
        SystemSpec(name="dualpath-rr", policy="rr-shorter-queue"),
        SystemSpec(name="dualpath-rr-random", policy="rr-random-side"),
        SystemSpec(name="dualpath", policy="dualpath"),
        SystemSpec(name="dualpath-split", policy="dualpath-split"),
        SystemSpec(name="oracle", policy="dualpath", load_path="free-io"),
    )
}


def get_system(name: str) -> SystemSpec:
    return lookup(SYSTEMS, name, "system")


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """One simulated run of one system.

    ``cluster``: a ``dualpath.spec.clusters.ClusterPreset`` (model, node, P, D, DRAM buffer,
    parallelism), or the local cluster (``sim.local.LocalClusterSpec``), whose engines' step
    times are ``profile``'s (a measured ``spec.engine_profile.EngineProfile``; it needs the local
    cluster and the local cluster needs it; its constants: ``sim.local.LOCAL_CALIBRATION``). ``trajectories`` are already expanded to the agents to run. ``aps``: None for
    offline (every agent starts at 0), else Poisson agent arrivals per second (online).
    ``horizon_s``: online arrival window. ``out_dir``: where per-request records are streamed
    (None: not written). ``cost_model``: a ``dualpath.cost`` name, or ``auto`` (the default):
    ``calibrated`` (the measured kernel tables) where the tables can be read, else the roofline;
    the result's ``cost_model`` says which ran and why. ``calibration``: the
    simulator's constants (``sim/calibration.py``). ``snic_directions``
    (``dualpath.core.links.SNIC_DIRECTIONS``): "shared" (default, the published numbers) books a
    node's storage reads and persists on one SNIC link; "duplex" gives persists the SNIC's other
    direction, as the runtime's emulated NICs do by default. ``pe_scope``: the scheduler's PE
    scope (``dualpath.policy.config.PE_SCOPES``: "central", every PE group a candidate at each PE
    fetch, or "group", the fetching group's PEs only); None: the policy's default. ``read_tie`` /
    ``pe_tie``: the scheduler's tie-breaks (``SchedulerConfig``'s fields of those names;
    ``dualpath.policy.config.READ_TIES`` / ``PE_TIES``; docs/policy.md, "Tie-breaks").
    ``pe_fetch`` (``PE_FETCHES``): when a PE group fetches: "boundary" (the default), between
    its iterations as an engine loop does (an idle group on the tick;
    ``policy.fetch.FetchOrder.pe_fetch_at_boundary``), or "tick", on the fetch timer whatever its
    engines do.
    """

    system: SystemSpec
    cluster: ClusterPreset | LocalClusterSpec
    seed: int = 0
    aps: float | None = None
    horizon_s: float = 600.0
    ttft_stop_s: float | None = None
    cost_model: str = "auto"
    block_len: int = 64
    out_dir: str | None = None
    max_sim_s: float = 1e7
    calibration: Calibration = DEFAULT_CALIBRATION
    snic_directions: str = "shared"
    pe_scope: str | None = None
    read_tie: str = "pe"
    pe_tie: str = "group"
    pe_fetch: str = "boundary"
    profile: EngineProfile | None = None

    def __post_init__(self) -> None:
        from dualpath.sim.local import LocalClusterSpec

        local = isinstance(self.cluster, LocalClusterSpec)
        require(
            local == (self.profile is not None),
            "profile" if local else "cluster",
            "none" if local else self.cluster.name,
            "the local cluster runs on a measured engine profile (--device profile:FILE)"
            if local
            else "an engine profile is the local CPU engine's: it needs the local cluster (--cluster local)",
        )
        require(self.aps is None or self.aps > 0, "aps", self.aps, "must be > 0")
        require(self.horizon_s > 0, "horizon_s", self.horizon_s, "must be > 0")
        require(self.block_len >= 1, "block_len", self.block_len, "must be >= 1")
        require(
            self.snic_directions in SNIC_DIRECTIONS,
            "snic_directions",
            self.snic_directions,
            f"choices: {', '.join(SNIC_DIRECTIONS)}",
        )
        check_scheduler_options(self.pe_scope, self.read_tie, self.pe_tie)
        require(self.pe_fetch in PE_FETCHES, "pe_fetch", self.pe_fetch, f"choices: {', '.join(PE_FETCHES)}")

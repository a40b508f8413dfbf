"""The flags of ``dualpath simulate`` and its subcommands, one dataclass per command: each field
is one flag (its default, help and type), and the command receives one instance
(``cli.option_fields``)."""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.cli._common import choices_help, default_of
from dualpath.cli.option_fields import option
from dualpath.core.links import SNIC_DIRECTIONS
from dualpath.policy.config import PE_SCOPES, PE_TIES, READ_TIES
from dualpath.sim.config import PE_FETCHES, SIM_COST_MODELS, SYSTEMS, SimConfig
from dualpath.sim.harness.experiments import WorkloadSpec
from dualpath.sim.harness.online import DEFAULT_APS, HORIZON_S
from dualpath.spec.clusters import DEFAULT_SIM_CLUSTER, get_cluster
from dualpath.spec.hardware import NODES

DEFAULT_CLUSTER = get_cluster(DEFAULT_SIM_CLUSTER)
WORKLOAD = WorkloadSpec()  # the offline workload's defaults
DEFAULT_SYSTEMS = "basic,dualpath,oracle"
DEFAULT_PD = f"{DEFAULT_CLUSTER.num_prefill_nodes}p{DEFAULT_CLUSTER.num_decode_nodes}d"
DEFAULT_SNIC_DIRECTIONS: str = default_of(SimConfig, "snic_directions")
_JSON_HELP = "Print one JSON object."


@dataclass(frozen=True)
class SimulateOptions:
    """``dualpath simulate``: a paper cluster (or the local one) serving agent trajectories."""

    model: str = option(DEFAULT_CLUSTER.model, help="Model name (see `dualpath models`).")
    pd: str = option(
        None,
        help=f"Prefill/decode nodes, e.g. 2p4d, 48p96d (default {DEFAULT_PD}; the local "
        "cluster: engines, default 1p2d).",
    )
    cluster: str = option(
        None,
        help="local: our own `dualpath serve` cluster on this machine (sim/local.py; needs "
        "--device profile:FILE). Default: the paper's cluster of --model / --pd / --node.",
    )
    device: str = option(
        None,
        help="profile:FILE: the engines' step times from a measured engine profile "
        "(`dualpath simulate profile --out FILE`); needs --cluster local.",
    )
    cnic_gbps: float = option(None, help="Local cluster: each engine's compute-NIC cap (default none).")
    max_turns: int = option(
        None, help="Local cluster: at most this many turns per agent (default: the demo's 6)."
    )
    node: str = option(DEFAULT_CLUSTER.node, help=choices_help("Node preset (spec.hardware)", NODES))
    snic_gbps: float = option(None, help="Each storage NIC's rate in Gbit/s instead of the node preset's.")
    snic_directions: str = option(
        DEFAULT_SNIC_DIRECTIONS,
        help=choices_help(
            "SNIC model: one link for reads and persists (shared) or one per direction (duplex)",
            SNIC_DIRECTIONS,
        ),
    )
    pe_scope: str = option(
        None,
        help=choices_help(
            "PE scope of the scheduler's PE choice (default: the policy's, group): the fetching "
            "group's PEs (group) or every PE group a candidate at each PE fetch (central)",
            PE_SCOPES,
        ),
    )
    read_tie: str = option(
        None,
        help=choices_help(
            "Read side on equal PE / DE read queues under the shorter rule (default: pe)", READ_TIES
        ),
    )
    pe_tie: str = option(
        None,
        help=choices_help(
            "Order of least-loaded PEs of equal tok_e (default: group order; read-queue: the "
            "smaller node read queue first)",
            PE_TIES,
        ),
    )
    pe_fetch: str = option(
        None,
        help=choices_help(
            "When a PE group fetches work (default: boundary): between its iterations, as an "
            "engine loop does (boundary), or on the fetch timer whatever it does (tick)",
            PE_FETCHES,
        ),
    )
    maxlen: str = option(f"{WORKLOAD.maxlen // 1024}k", help="Trajectory MaxLen bucket: 32k, 48k or 64k.")
    agents: int = option(
        None,
        help=f"Number of agents (offline; default {WORKLOAD.num_agents}, the local cluster: the demo's 6).",
    )
    system: str = option(DEFAULT_SYSTEMS, help=choices_help("Comma list of systems", SYSTEMS))
    online: bool = option(False, help="Online: Poisson agent arrivals, capacity sweep.")
    aps: str = option(DEFAULT_APS, help="Online rates lo:hi:step or a comma list.")
    horizon: float = option(HORIZON_S, help="Online: seconds of arrivals per rate.")
    trace: str = option(None, help="Replay a trace (e.g. mooncake) instead of synthetic.")
    append_scale: float = option(WORKLOAD.append_scale, help="Scale every append length.")
    gen_scale: float = option(WORKLOAD.gen_scale, help="Scale every generation length.")
    dram_buffer_gb: float = option(None, help="DRAM buffer per node (default per model).")
    cost_model: str = option(
        default_of(SimConfig, "cost_model"),
        help=choices_help(
            "Cost model (auto: calibrated when the kernel tables are there, else roofline)",
            SIM_COST_MODELS,
        ),
    )
    seed: int = option(default_of(SimConfig, "seed"), help="Seed for the workload and arrivals.")
    out: str = option(None, help="Folder for per-request CSV records and results.")
    calibrate: list[str] = option(
        None,
        help="Override a calibration constant for this run, NAME=VALUE (repeatable; "
        "see sim/calibration.py), e.g. --calibrate STORAGE_EFFICIENCY=0.6.",
    )
    json_out: bool = option(False, "--json", help=_JSON_HELP)

    @property
    def pd_or_default(self) -> str:
        return self.pd or DEFAULT_PD

    @property
    def num_agents(self) -> int:
        """Offline agents on a paper cluster (the local cluster has its own default)."""
        return self.agents if self.agents is not None else WORKLOAD.num_agents

    @property
    def systems(self) -> list[str]:
        return [s.strip() for s in self.system.split(",") if s.strip()]


@dataclass(frozen=True)
class ProfileOptions:
    out: str = option(..., help="Profile file to write (JSON).")
    model: str = option("smollm2-135m", help="The engines' model (a name, a path, or tiny).")
    quick: bool = option(False, help="A coarse grid (a smoke check, ~10 s with tiny).")
    json_out: bool = option(False, "--json", help=_JSON_HELP)


@dataclass(frozen=True)
class FiguresOptions:
    out: str = option("sim_figures", help="Output folder for PNG + CSV/JSON.")
    quick: bool = option(False, help="Smaller agent counts and horizons.")
    json_out: bool = option(False, "--json", help=_JSON_HELP)


@dataclass(frozen=True)
class FidelityOptions:
    quick: bool = option(
        False,
        help="Agents / 16, 600 s online horizon, coarse rates, "
        "large-scale points on 8P16D / 4P8D (under ~1 min).",
    )
    json_out: bool = option(False, "--json", help=_JSON_HELP)
    out: str = option(None, help="Folder for fidelity.csv, fidelity.png, fidelity.json.")
    pe_scope: str = option(
        None, help=choices_help("PE scope for every run (default: the policies', group)", PE_SCOPES)
    )
    read_tie: str = option(
        None, help=choices_help("Read side on equal read queues, every run (default: pe)", READ_TIES)
    )
    pe_tie: str = option(
        None, help=choices_help("Order of PEs of equal tok_e, every run (default: group)", PE_TIES)
    )
    pe_fetch: str = option(
        None, help=choices_help("When PE groups fetch, every run (default: boundary)", PE_FETCHES)
    )
    calibrate: list[str] = option(
        None, help="Override a calibration constant in every run, NAME=VALUE (repeatable)."
    )

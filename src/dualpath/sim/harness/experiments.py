"""Building blocks shared by the CLI, the figures and the benchmarks: cluster presets from
``--model``/``--pd``, agent workloads (synthetic or trace), and the offline grid runner."""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.core.registry import lookup
from dualpath.spec.clusters import CLUSTERS, ClusterPreset, parse_pd
from dualpath.spec.models import MODELS

# DRAM buffer per node when not given: the paper's preset for the model (spec.clusters: 80 GB for the
# DeepSeek models, 320 GB for Qwen 32B), else the paper's DeepSeek default.
_BUFFER_GB = {c.model: c.dram_buffer_gb for c in CLUSTERS.values()}
DEFAULT_BUFFER_GB = 80.0
DEFAULT_NODE = "hopper-8x400"


def make_cluster(
    model: str, pd: str, *, node: str = DEFAULT_NODE, dram_buffer_gb: float | None = None
) -> ClusterPreset:
    """A preset for any model and P/D: EP + attention DP for MoE models, DP otherwise."""
    spec = lookup(MODELS, model, "model")
    p, d = parse_pd(pd)
    buffer_gb = dram_buffer_gb if dram_buffer_gb is not None else _BUFFER_GB.get(model, DEFAULT_BUFFER_GB)
    return ClusterPreset(
        name=f"{model}-{p}p{d}d",
        model=model,
        node=node,
        num_prefill_nodes=p,
        num_decode_nodes=d,
        dram_buffer_gb=buffer_gb,
        parallelism="ep_dp" if spec.is_moe else "dp",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """Where agents come from: the synthetic generator at ``maxlen`` (500 base trajectories, as in
    the paper) or a trace (``trace`` = name or path for ``dualpath.workload.load_trace``)."""

    maxlen: int = 65536
    num_agents: int = 64
    seed: int = 0
    trace: str | None = None
    append_scale: float = 1.0
    gen_scale: float = 1.0
    num_base: int = 500


def make_trajectories(spec: WorkloadSpec) -> list:
    from dualpath.workload import ReplayConfig, expand_agents, generate_trajectories, load_trace

    if spec.trace:
        base = load_trace(spec.trace)  # workload resolves aliases such as "mooncake"
    else:
        base = generate_trajectories(maxlen=spec.maxlen, num=spec.num_base, seed=spec.seed)
    cfg = ReplayConfig(
        num_agents=spec.num_agents,
        seed=spec.seed,
        append_scale=spec.append_scale,
        gen_scale=spec.gen_scale,
        max_len=spec.maxlen if (spec.append_scale != 1.0 or spec.gen_scale != 1.0) else None,
    )
    return expand_agents(base, cfg)


def offline(systems: list[str], cluster: ClusterPreset, workload: WorkloadSpec, **kw) -> dict:
    """Offline JCT of each system on the same agents."""
    from dualpath.sim.harness.runner import run_systems

    return run_systems(systems, cluster, make_trajectories(workload), **kw)

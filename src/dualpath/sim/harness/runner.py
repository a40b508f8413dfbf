"""Entry points: build agents from trajectories, run one system or several, offline or online.

``run_systems`` is what the CLI, the figures and the benchmarks call. Every run checks the
invariants of ``metrics.check_invariants`` and raises on a violation.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence

from dualpath.sim.config import SimConfig, get_system
from dualpath.sim.request import Agent

GC_THRESHOLD0 = 200_000  # young-generation threshold while a simulation runs (default 700)


def make_agents(trajectories: Sequence) -> list[Agent]:
    """One agent per trajectory (``dualpath.workload.Trajectory``), turns as (append, gen)."""
    return [
        Agent(i, t.traj_id, [(turn.append_len, turn.gen_len) for turn in t.turns])
        for i, t in enumerate(trajectories)
    ]


def run_one(config: SimConfig, trajectories: Sequence) -> dict:
    """Simulate one system; returns its summary (see ``Metrics.finish``) with ``wall_s``."""
    from dualpath.sim.driver import Simulation

    start = time.perf_counter()
    sim = Simulation(config, make_agents(trajectories))
    # A run allocates millions of short-lived, acyclic objects (freed by reference counting);
    # the cyclic collector's frequent young-generation passes over them are pure overhead.
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], GC_THRESHOLD0), *thresholds[1:])
    try:
        result = sim.run()
    finally:
        gc.set_threshold(*thresholds)
    result["wall_s"] = time.perf_counter() - start
    result["requests_per_wall_s"] = result["num_requests"] / max(result["wall_s"], 1e-9)
    return result


def run_systems(systems: Sequence[str], cluster, trajectories: Sequence, **kw) -> dict[str, dict]:
    """Run each named system on the same cluster and agents (``kw`` goes to ``SimConfig``)."""
    return {
        name: run_one(SimConfig(system=get_system(name), cluster=cluster, **kw), trajectories)
        for name in systems
    }

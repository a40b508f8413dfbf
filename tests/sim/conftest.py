from __future__ import annotations

import pytest

from dualpath.spec.clusters import ClusterPreset
from dualpath.workload import Trajectory, Turn


def _make_cluster(
    p: int = 1, d: int = 1, model: str = "ds-27b", buffer_gb: float = 80.0, parallelism: str = "ep_dp"
) -> ClusterPreset:
    return ClusterPreset(
        name=f"test-{p}p{d}d",
        model=model,
        node="hopper-8x400",
        num_prefill_nodes=p,
        num_decode_nodes=d,
        dram_buffer_gb=buffer_gb,
        parallelism=parallelism,
    )


def _make_trajectories(
    num: int, turns: int = 6, first: int = 4096, append: int = 300, gen: int = 40
) -> list[Trajectory]:
    """Agent-like trajectories: a long first prompt, then short appends (high hit rate)."""
    out = []
    for i in range(num):
        ts = [Turn(append_len=first + 64 * (i % 5), gen_len=gen)]
        ts += [Turn(append_len=append + 7 * ((i + k) % 11), gen_len=gen + (k % 3)) for k in range(turns - 1)]
        out.append(Trajectory(traj_id=f"t{i}", turns=tuple(ts)))
    return out


@pytest.fixture
def make_cluster():
    """Factory: a small preset (DS 27B, the paper's 1P1D model, by default)."""
    return _make_cluster


@pytest.fixture
def make_trajectories():
    """Factory: agent-like trajectories (long first prompt, short appends)."""
    return _make_trajectories

"""The fixed costs of sim/calibration.py land where they should (issue 14 section 2)."""

from __future__ import annotations

import dataclasses

import pytest

from dualpath.core.errors import ConfigError
from dualpath.sim.calibration import DEFAULT_CALIBRATION
from dualpath.sim.config import SimConfig, get_system
from dualpath.sim.harness.runner import run_one

ZERO = dict(
    storage_read_latency_s=0.0,
    buffer_alloc_s=0.0,
    pd_handoff_s=0.0,
    pd_layer_handoff_s=0.0,
    decode_join_s=0.0,
)


def _run(system: str, cluster, trajs, **fixed: float) -> dict:
    cal = dataclasses.replace(DEFAULT_CALIBRATION, **{**ZERO, **fixed})
    return run_one(SimConfig(system=get_system(system), cluster=cluster, calibration=cal), trajs)


def test_storage_latency_and_allocation_are_in_their_breakdown_states(
    make_cluster, make_trajectories
) -> None:
    trajs = make_trajectories(16, turns=4, first=8192)
    cluster = make_cluster(1, 1)
    base = _run("dualpath", cluster, trajs)
    slow = _run("dualpath", cluster, trajs, storage_read_latency_s=0.008, buffer_alloc_s=0.004)
    db, ds = base["ttft_breakdown_s"], slow["ttft_breakdown_s"]
    # every turn after the first reads hits; the mean over all requests moves by most of it
    assert ds["reading"] - db["reading"] > 0.004
    assert ds["allocation"] - db["allocation"] > 0.002
    assert slow["mean_ttft_s"] > base["mean_ttft_s"]


def test_pd_handoff_delays_the_second_token_but_not_under_oracle(make_cluster, make_trajectories) -> None:
    trajs = make_trajectories(16, turns=4, first=8192)
    cluster = make_cluster(1, 1)
    base = _run("dualpath", cluster, trajs)
    slow = _run("dualpath", cluster, trajs, pd_handoff_s=0.03)
    assert slow["mean_ttst_s"] - base["mean_ttst_s"] > 0.02
    o_base, o_slow = _run("oracle", cluster, trajs), _run("oracle", cluster, trajs, pd_handoff_s=0.03)
    assert o_slow["jct_s"] == o_base["jct_s"]  # Oracle bypasses PD transfers


def test_decode_join_stall_slows_decode(make_cluster, make_trajectories) -> None:
    trajs = make_trajectories(32, turns=4, first=2048, gen=80)
    cluster = make_cluster(1, 1)
    base = _run("oracle", cluster, trajs)
    slow = _run("oracle", cluster, trajs, decode_join_s=0.005)
    assert slow["mean_tpot_s"] > base["mean_tpot_s"]


@pytest.mark.parametrize("name", ["STORAGE_READ_LATENCY_S=0.5", "PD_HANDOFF_S=-1", "PD_LAYER_HANDOFF_S=0.01"])
def test_fixed_costs_outside_their_physical_range_fail(name: str) -> None:
    with pytest.raises(ConfigError):
        DEFAULT_CALIBRATION.with_overrides([name])

"""The early attention balance (spec section 10: "attention time max/avg inside an EP group 1.06
early in the run"), read as the storage-NIC max/avg next to it: per-GPU totals over the window."""

from __future__ import annotations

from array import array

from dualpath.sim.config import SimConfig, get_system
from dualpath.sim.harness.runner import run_one
from dualpath.sim.metrics import gpu_totals_balance


def test_an_idle_gpu_counts_and_the_window_is_totalled() -> None:
    # 2 GPUs; t=0: GPU 1 has no batch (it waits at the MoE: a bubble); t=1: equal; t=2: late
    iter_t = array("d", [0.0, 1.0, 2.0])
    attn = array("d", [1.0, 0.0, 0.5, 0.5, 0.0, 9.0])
    assert gpu_totals_balance(2, iter_t, attn, 1.0) == 1.5  # totals 1.5 / 0.5 over their mean 1.0
    assert gpu_totals_balance(2, iter_t, attn, 0.5) == 2.0  # only the first iteration
    assert gpu_totals_balance(2, iter_t, attn, 5.0) == 9.5 * 2 / 11.0  # the whole record


def test_no_balance_without_two_gpus_or_attention() -> None:
    assert gpu_totals_balance(1, array("d", [0.0]), array("d", [1.0]), 1.0) is None
    assert gpu_totals_balance(2, array("d", [5.0]), array("d", [1.0, 0.0]), 1.0) is None  # late
    assert gpu_totals_balance(2, array("d"), array("d"), 1.0) is None


def test_run_reports_both_readings(make_cluster, make_trajectories) -> None:
    trajs = make_trajectories(64, turns=6, first=8192)
    res = run_one(SimConfig(system=get_system("dualpath"), cluster=make_cluster(1, 1)), trajs)
    early, per_iteration = res["attn_max_over_avg_early"], res["attn_iter_max_over_avg_early"]
    assert early >= 1.0 and per_iteration >= 1.0

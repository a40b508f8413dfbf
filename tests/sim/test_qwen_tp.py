"""Qwen2.5-32B (dense, DP) on the paper's 1P2D: engines are TP-2 groups (see cluster.tp_degree)."""

from __future__ import annotations

from dualpath.cost import weight_bytes_per_gpu
from dualpath.sim.calibration import DEFAULT_CALIBRATION as cal
from dualpath.sim.cluster import Cluster
from dualpath.sim.harness.runner import run_systems
from dualpath.spec import get_cluster


def test_tp_degree_only_for_dense_models_that_need_it() -> None:
    qwen = Cluster(get_cluster("qwen32b-1p2d"), cal)
    assert qwen.tp_size == 2 and qwen.num_gpus_per_node == 4 and len(qwen.gpus) == 12
    one_gpu = qwen.node_spec.gpu_spec
    assert qwen.gpu_spec.hbm_gb == 2 * one_gpu.hbm_gb
    assert qwen.gpu_spec.bf16_tflops == 2 * one_gpu.bf16_tflops
    # TP 1 would not hold the weights in usable HBM; TP 2 holds them plus one 64K context
    weights = weight_bytes_per_gpu(qwen.model)
    usable = one_gpu.hbm_gb * 1e9 * cal.hbm_usable_fraction
    assert usable < weights
    assert 2 * usable - weights >= cal.min_kv_tokens_per_engine * qwen.model.kv_bytes_per_token
    for name in ("ds660b-2p4d", "ds27b-1p1d"):  # EP models: one engine per GPU, spec GPU as is
        ds = Cluster(get_cluster(name), cal)
        assert ds.tp_size == 1 and ds.gpu_spec == ds.node_spec.gpu_spec and ds.num_gpus_per_node == 8


def test_qwen_1p2d_runs_all_systems_ordered(make_trajectories) -> None:
    trajs = make_trajectories(24, turns=5, first=16384, append=300, gen=24)
    res = run_systems(["oracle", "dualpath", "basic"], get_cluster("qwen32b-1p2d"), trajs)
    for system, result in res.items():
        assert result["agents_finished"] == 24, system
        assert result["num_requests"] == sum(t.num_turns for t in trajs), system
        assert result["max_link_utilisation"] <= 1.0 + 1e-9, system
    assert res["oracle"]["ttft_breakdown_s"]["reading"] == 0.0
    assert res["oracle"]["jct_s"] <= res["dualpath"]["jct_s"] * 1.001
    assert res["dualpath"]["jct_s"] <= res["basic"]["jct_s"] * 1.001

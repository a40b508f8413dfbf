"""GPU, node and cluster tables."""

from __future__ import annotations

import dataclasses

import pytest

from dualpath.core.errors import ConfigError, UnknownNameError
from dualpath.spec.clusters import CLUSTERS, get_cluster, parse_pd
from dualpath.spec.hardware import GPUS, NODES, get_gpu, get_node


def test_gpu_table_from_aiconfigurator() -> None:
    assert {"a100", "h100", "h200", "b200"} <= set(GPUS)
    assert {"a100-40gb", "l40s", "l4", "a10g", "t4", "v100", "m60"} <= set(GPUS)  # planner catalogue
    assert get_gpu("h100").dense_tflops("fp8") == 1978.0
    assert get_gpu("b200").dense_tflops("fp4") == 9000.0
    assert get_gpu("h200").hbm_bandwidth_gbs == 4800.0
    assert get_gpu("a100").tdp_w == 400.0


def test_dtype_errors_and_fallback() -> None:
    a100 = get_gpu("a100")
    with pytest.raises(ConfigError, match="not supported by a100"):
        a100.dense_tflops("fp8")
    with pytest.raises(ConfigError, match="choices"):
        a100.dense_tflops("fp3")
    assert a100.compute_tflops("fp8") == 312.0
    assert get_gpu("h100").compute_tflops("fp4") == 1978.0
    assert get_gpu("b200").best_dense_tflops() == ("fp4", 9000.0)


def test_paper_node() -> None:
    n = get_node("hopper-8x400")
    assert (n.num_gpus, n.cnic_gbps, n.num_snics, n.snic_gbps) == (8, 400.0, 1, 400.0)
    assert n.snic_bytes_per_s == 50e9 and n.cnic_bytes_per_s == 50e9
    assert n.dram_bandwidth_gbs == 500.0 and n.dram_buffer_gb == 80.0
    assert {"dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200"} <= set(NODES)


def test_node_validation() -> None:
    n = get_node("hopper-8x400")
    with pytest.raises(UnknownNameError, match="gpu=.p100."):
        dataclasses.replace(n, gpu="p100")
    with pytest.raises(ConfigError, match="num_snics=0"):
        dataclasses.replace(n, num_snics=0)
    with pytest.raises(UnknownNameError, match="choices"):
        get_node("hopper")


def test_clusters() -> None:
    c = get_cluster("ds660b-2p4d")
    assert (c.num_prefill_nodes, c.num_decode_nodes, c.num_gpus) == (2, 4, 48)
    assert c.model_spec.name == "deepseek-v3.2" and c.parallelism == "ep_dp"
    assert get_cluster("ds660b-48p96d").num_gpus == 1152
    assert get_cluster("ds660b-44p88d").pd_label == "44P88D"
    assert get_cluster("qwen32b-1p2d").dram_buffer_gb == 320.0
    assert get_cluster("ds27b-1p1d").model == "ds-27b"
    assert len(CLUSTERS) == 5
    with pytest.raises(ConfigError, match="parallelism='tp'"):
        dataclasses.replace(c, parallelism="tp")  # type: ignore[arg-type]
    with pytest.raises(UnknownNameError, match="model='nope'"):
        dataclasses.replace(c, model="nope")


def test_parse_pd() -> None:
    assert parse_pd("2p4d") == (2, 4)
    assert parse_pd("48P96D") == (48, 96)
    for bad in ("2p", "0p1d", "p4d", "2x4"):
        with pytest.raises(ConfigError, match="pd="):
            parse_pd(bad)

"""Kernel-table ops: table points returned exactly, monotone in between, roofline reported."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dualpath.cost.kernels import KernelTables
from dualpath.spec.systems import get_system

pq = pytest.importorskip("pyarrow.parquet", reason="kernel tables need pyarrow (the calibrated extra)")


def _rows(data: Path, system: str, rel: str, **equal: object) -> list[dict]:
    (path,) = sorted((data / "hardware/aiconfigurator-perf-db" / system).glob(rel))
    return [r for r in pq.read_table(path).to_pylist() if all(r[k] == v for k, v in equal.items())]


def test_gemm_exact_at_table_points_and_monotone(shipped_data: Path) -> None:
    # the shipped H100 slice has fp8_block GEMMs at n = k = 7168 (tests/data/README.md)
    kt = KernelTables.load(get_system("h100_sxm"), shipped_data)
    rows = sorted(
        _rows(shipped_data, "h100_sxm", "gemm/*/*/gemm_perf.parquet", gemm_dtype="fp8_block", n=7168, k=7168),
        key=lambda r: r["m"],
    )
    assert len(rows) > 10
    for r in rows:
        t = kt.gemm(r["m"], 7168, 7168, "fp8_block")
        assert t.time_s == pytest.approx(r["latency"] * 1e-3, rel=1e-12)
        assert t.source == "table gemm_perf fp8_block"
    for lo, hi in zip(rows, rows[1:]):
        if lo["latency"] <= hi["latency"] and hi["m"] > lo["m"] + 1:
            mid = kt.gemm((lo["m"] + hi["m"]) / 2, 7168, 7168, "fp8_block").time_s
            assert lo["latency"] * 1e-3 <= mid <= hi["latency"] * 1e-3


def test_generation_mla_exact_at_points(shipped_data: Path) -> None:
    kt = KernelTables.load(get_system("h100_sxm"), shipped_data)
    rows = _rows(
        shipped_data, "h100_sxm", "mla/*/*/generation_mla_perf.parquet", num_heads=128, kv_cache_dtype="fp8"
    )
    for r in rows[:40]:
        t = kt.mla_kernel(
            "generation",
            batch=r["batch_size"],
            length=r["step"],
            heads=128,
            kv_dtype="fp8",
            flops=1.0,
            num_bytes=1.0,
        )
        same = [x["latency"] for x in rows if (x["batch_size"], x["step"]) == (r["batch_size"], r["step"])]
        assert t.time_s == pytest.approx(sum(same) / len(same) * 1e-3, rel=1e-12)


def test_attention_and_moe_exact_at_points(reference_data: Path) -> None:
    kt = KernelTables.load(get_system("h200_sxm"), reference_data)
    ctx = _rows(
        reference_data,
        "h200_sxm",
        "attention/*/*/context_attention_perf.parquet",
        num_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        window_size=0,
        attn_dtype="bfloat16",
        kv_cache_dtype="fp8",
    )
    for r in ctx[::37]:
        t = kt.context_attention(
            batch=r["batch_size"], isl=r["isl"], prefix=0, heads=32, kv_heads=4, head_dim=128, kv_dtype="fp8"
        )
        assert t.time_s == pytest.approx(r["latency"] * 1e-3, rel=1e-12)
    moe = _rows(
        reference_data,
        "h200_sxm",
        "moe/*/*/moe_perf.parquet",
        hidden_size=4096,
        inter_size=1536,
        topk=8,
        num_experts=128,
        moe_tp_size=1,
        moe_ep_size=4,
        distribution="balanced",
        moe_dtype="fp8_block",
    )
    assert moe
    for r in moe:
        t = kt.moe(
            tokens=r["num_tokens"],
            hidden=4096,
            inter=1536,
            topk=8,
            experts=128,
            moe_tp=1,
            moe_ep=4,
            dtype="fp8_block",
        )
        assert t.time_s == pytest.approx(r["latency"] * 1e-3, rel=1e-12)


def test_prefix_keeps_the_causal_fraction(reference_data: Path) -> None:
    kt = KernelTables.load(get_system("h100_sxm"), reference_data)
    kwargs = dict(batch=1, heads=32, kv_heads=8, head_dim=128, kv_dtype="bfloat16")
    full = kt.context_attention(isl=4096, prefix=0, **kwargs).time_s
    half = kt.context_attention(isl=2048, prefix=2048, **kwargs).time_s
    assert half == pytest.approx(full * 0.75)


def test_moe_layout_stands_in_at_equal_gpu_count(reference_data: Path) -> None:
    kt = KernelTables.load(get_system("h100_sxm"), reference_data)
    # Qwen3-235B-FP8 experts have no fp8_block rows at moe_tp 8: read tp4 ep2 (8 GPUs too)
    t = kt.moe(tokens=64, hidden=4096, inter=1536, topk=8, experts=128, moe_tp=8, moe_ep=1, dtype="fp8_block")
    assert t.source.startswith("table moe_perf fp8_block balanced tp4 ep2 for tp8 ep1")


def test_moe_reads_the_asked_routing_else_balanced(reference_data: Path) -> None:
    kt = KernelTables.load(get_system("h100_sxm"), reference_data)
    shape = dict(hidden=4096, inter=1536, topk=8, experts=128, moe_tp=1, moe_ep=8, dtype="fp8")
    skewed = kt.moe(tokens=8192, distribution="power_law_1.01", **shape)
    even = kt.moe(tokens=8192, **shape)
    assert skewed.source.startswith("table moe_perf fp8 power_law_1.01 tp1 ep8")
    assert skewed.time_s > even.time_s  # at thousands of tokens the hot EP rank sets the time
    missing = kt.moe(tokens=64, distribution="power_law_9", **shape)
    assert missing.source.startswith("table moe_perf fp8 balanced")
    assert missing.time_s == kt.moe(tokens=64, **shape).time_s


def test_a_data_dir_without_tables_uses_the_bundled_ones(tmp_path: Path) -> None:
    kt = KernelTables.load(get_system("h100_sxm"), tmp_path)
    assert kt.tables is not None and kt.tables.bundled
    assert kt.describe()["origin"] == "bundled h100_sxm.npz" and "trtllm" in kt.describe()["gemm"]
    assert kt.gemm(128, 4096, 4096, "bfloat16").source.startswith("table gemm_perf")


def test_no_tables_falls_back_to_roofline_and_says_why(tmp_path: Path) -> None:
    # none in the folder, none bundled, and no kin system to read from
    kt = replace(KernelTables.load(get_system("gb200"), tmp_path), anchor=None)
    t = kt.gemm(128, 4096, 4096, "bfloat16")
    assert t.time_s > 0 and t.source.startswith("roofline:") and "DUALPATH_DATA_DIR" in t.source
    a = kt.generation_attention(batch=8, kv_len=1000, heads=8, kv_heads=2, head_dim=128, kv_dtype="fp8")
    b = kt.generation_attention(batch=8, kv_len=8000, heads=8, kv_heads=2, head_dim=128, kv_dtype="fp8")
    assert 0 < a.time_s < b.time_s
    ring = kt.collective("all_reduce", elements=1e6, num_gpus=4)
    assert ring.source.startswith("ring") and ring.time_s > 0
    assert kt.collective("all_reduce", elements=1e6, num_gpus=1).time_s == 0.0


def test_a_system_without_a_table_reads_its_kin_plus_the_roofline_difference(tmp_path: Path) -> None:
    b200 = KernelTables.load(get_system("b200_sxm"), tmp_path)  # B200 has no GEMM or NCCL tables
    h200 = KernelTables.load(get_system("h200_sxm"), tmp_path)
    assert b200.anchor is not None and b200.anchor.system.name == "h200_sxm"
    t = b200.gemm(128, 4096, 4096, "bfloat16")
    assert t.source.startswith("table gemm_perf") and t.source.endswith("on h200_sxm + roofline difference")
    alone = KernelTables(system=b200.system, tables=b200.tables)  # no kin: B200's own roofline
    bare = alone.gemm(128, 4096, 4096, "bfloat16").time_s
    h200_roof = KernelTables(system=h200.system, tables=None).gemm(128, 4096, 4096, "bfloat16").time_s
    measured = h200.gemm(128, 4096, 4096, "bfloat16").time_s
    assert t.time_s == pytest.approx(max(measured - h200_roof + bare, bare))
    # a small all-reduce keeps the measured latency, not the ring's (n - 1) hops of p2p latency
    ar = b200.collective("all_reduce", elements=4096, num_gpus=8, backend="trtllm")
    ring = alone.collective("all_reduce", elements=4096, num_gpus=8, backend="trtllm")
    assert "custom_allreduce_perf" in ar.source and ar.time_s < ring.time_s / 5

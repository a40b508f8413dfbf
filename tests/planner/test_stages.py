"""Stage work model (cost/stages.py) and the Device roofline (issue 11, sections 1, 2 and 13)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.core.errors import ConfigError
from dualpath.cost.efficiency import DEFAULT_EFFICIENCY, IDEAL_EFFICIENCY, get_efficiency
from dualpath.cost.stages import (
    STAGES,
    hidden_act_bytes_per_token,
    kv_bytes_per_token,
    kv_cache_bytes,
    stage_roofline_s,
    stage_time_s,
    stage_weight_bytes,
    stage_work,
)
from dualpath.planner.ablation import apply_overrides
from dualpath.planner.report import PAPER_MODELS
from dualpath.spec.device import Device, DeviceSpec
from dualpath.spec.hardware import get_gpu
from dualpath.spec.models import MODELS, get_model


def test_paper_models_in_table() -> None:
    assert set(PAPER_MODELS) <= set(MODELS)


def test_kv_elements_per_token_layer() -> None:
    assert get_model("deepseek-v3.2").kv_elements_per_token_layer == 512 + 64  # mla
    assert get_model("glm-4.6").kv_elements_per_token_layer == 2 * 8 * 128  # gqa
    assert get_model("deepseek-v4-flash").kv_elements_per_token_layer == 512  # csa head_dim
    assert apply_overrides(get_model("glm-4.6"), {"kv_width": 300}).kv_elements_per_token_layer == 300


@pytest.mark.parametrize("name", PAPER_MODELS + ("deepseek-v3.2",))
def test_da_kv_share_rises_with_context_and_kv_width(name: str) -> None:
    model = get_model(name)
    shares = [stage_work(model, "da", batch=32, context_len=c).kv_share() for c in (1000, 10000, 100000)]
    assert shares[0] < shares[1] < shares[2]
    works = [
        stage_work(apply_overrides(model, {"kv_width": w}), "da", batch=32, context_len=50000)
        for w in (128, 512, 1024, 4096)
    ]
    assert all(a.kv_share() < b.kv_share() for a, b in zip(works, works[1:]))
    assert len({w.flops for w in works}) == 1  # kv_width changes bytes only
    assert works[0].flops == stage_work(model, "da", batch=32, context_len=50000).flops


@pytest.mark.parametrize("name", PAPER_MODELS)
@pytest.mark.parametrize("stage", STAGES)
def test_bytes_scale_with_bits_flops_do_not(name: str, stage: str) -> None:
    model = get_model(name)
    works = {
        b: stage_work(model, stage, batch=4, context_len=2000, bits=b)  # type: ignore[arg-type]
        for b in (4, 8, 16)
    }
    assert works[4].flops == works[8].flops == works[16].flops
    for term in ("weight_bytes", "kv_read_bytes", "kv_write_bytes", "act_bytes"):
        b16 = getattr(works[16], term)
        assert math.isclose(getattr(works[8], term), b16 / 2, rel_tol=1e-12)
        assert math.isclose(getattr(works[4], term), b16 / 4, rel_tol=1e-12)
    assert works[16].total_bytes() > 0


def test_decode_attention_bytes_are_weights_plus_kv() -> None:
    model = get_model("glm-4.6")
    w = stage_work(model, "da", batch=8, context_len=20000)
    assert w.weight_bytes == stage_weight_bytes(model, "da")[0]
    assert w.kv_read_bytes == 8 * kv_cache_bytes(model, 20000)  # dense GQA reads all it keeps
    assert w.kv_write_bytes == 8 * kv_bytes_per_token(model)
    assert w.act_bytes == 2 * 8 * model.num_layers * hidden_act_bytes_per_token(model)
    assert w.total_bytes() == w.weight_bytes + w.kv_read_bytes + w.kv_write_bytes + w.act_bytes
    assert w.stage == "da" and w.attention_flops > 0 and w.routed_flops == 0


def test_decode_reads_only_the_capped_part() -> None:
    ds = get_model("deepseek-v3.2")  # DSA top-k 2048: main KV read capped, indexer keys not
    a, b = (stage_work(ds, "da", batch=1, context_len=c) for c in (10000, 20000))
    index_per_token = ds.num_layers * ds.index_head_dim * 2
    assert math.isclose(b.kv_read_bytes - a.kv_read_bytes, 10000 * index_per_token, rel_tol=1e-12)
    oss = get_model("gpt-oss-120b")  # window 128 on half the layers
    a, b = (stage_work(oss, "da", batch=1, context_len=c) for c in (10000, 20000))
    assert math.isclose(
        b.kv_read_bytes - a.kv_read_bytes, 10000 * (oss.num_layers // 2) * oss.kv_elements_per_token_layer * 2
    )


@pytest.mark.parametrize("name", sorted(MODELS))
def test_kv_cache_entries_match_spec(name: str) -> None:
    model = get_model(name)
    per_entry = model.kv_elements_per_token_layer * 2  # bytes at 16 bits
    index = model.index_head_dim * 2 if model.index_num_heads else 0
    for c in (1, 127, 5000, 70001):
        got = kv_cache_bytes(model, c)
        spec_entries = model.kv_bytes(c) / model.kv_bytes_per_token_layer
        if model.attention_kind == "csa":
            csa_layers = sum(r == 4 for r in model.compress_ratios)
            expected = spec_entries * per_entry + csa_layers * (c // 4) * index
        else:
            expected = spec_entries * per_entry + model.num_layers * c * index
        assert math.isclose(got, expected, rel_tol=1e-12), c


def test_prefill_writes_what_it_hands_off() -> None:
    model = get_model("deepseek-v4-flash")
    pa = stage_work(model, "pa", batch=3, context_len=9000)
    assert pa.kv_read_bytes == 0.0
    assert math.isclose(pa.kv_write_bytes, 3 * kv_cache_bytes(model, 9000), rel_tol=1e-12)
    pf = stage_work(model, "pf", batch=3, context_len=9000)
    assert pf.kv_share() == 0.0
    assert math.isclose(pf.weight_bytes, sum(stage_weight_bytes(model, "pf")), rel_tol=1e-9)


def test_touched_experts_grow_with_batch() -> None:
    model = get_model("gpt-oss-120b")
    weights = [stage_work(model, "df", batch=b, context_len=1000).weight_bytes for b in (1, 8, 64, 512)]
    assert all(a < b for a, b in zip(weights, weights[1:]))
    non_expert, routed = stage_weight_bytes(model, "df")
    assert weights[0] > non_expert and weights[-1] <= non_expert + routed + 1.0


def test_dtype_override_sets_element_bytes() -> None:
    model = get_model("glm-4.6")
    base = stage_work(model, "da", batch=4, context_len=4000)
    half = stage_work(apply_overrides(model, {"dtype_bytes": 1}), "da", batch=4, context_len=4000)
    assert half.weight_bytes == base.weight_bytes / 2 and half.act_bytes == base.act_bytes / 2
    assert half.kv_read_bytes == base.kv_read_bytes and half.flops == base.flops
    every = apply_overrides(model, {"dtype_bytes": 1, "dtype_scope": "all"})
    assert stage_work(every, "da", batch=4, context_len=4000).kv_read_bytes == base.kv_read_bytes / 2


NPU = DeviceSpec(
    name="npu-test", compute_tflops=250.0, memory_family="hbm", capacity_gb=80.0, bandwidth_gbs=3350.0
)


def test_devices_implement_protocol() -> None:
    h100 = get_gpu("h100")
    for dev in (NPU, h100, get_gpu("t4")):
        assert isinstance(dev, Device)
    assert NPU.peak_flops(4) == NPU.peak_flops(8) == NPU.peak_flops(16) == 250e12
    assert h100.peak_flops(16) == 989e12 and h100.peak_flops(8) == 1978e12
    assert h100.peak_flops(4) == 1978e12  # no FP4 on Hopper: runs at FP8
    assert get_gpu("a100").peak_flops(8) == 312e12
    from dualpath.spec.hardware import GPUS

    for gpu in GPUS.values():  # the fast path agrees with the dtype table's fallback
        for bits, dtype in ((4, "fp4"), (8, "fp8"), (16, "bf16")):
            assert gpu.peak_flops(bits) == gpu.compute_tflops(dtype) * 1e12
    with pytest.raises(ConfigError, match="bits=12"):
        NPU.peak_flops(12)
    with pytest.raises(ConfigError, match="memory_family='flash'"):
        dataclasses.replace(NPU, memory_family="flash")


def test_ideal_time_is_eq1() -> None:
    w = stage_work(get_model("glm-4.6"), "da", batch=64, context_len=100000)
    t = stage_time_s(w, NPU)
    assert t == max(w.flops / 250e12, w.total_bytes() / 3350e9)
    assert stage_roofline_s(w, NPU) == (w.flops / 250e12, w.total_bytes() / 3350e9)
    assert get_efficiency("ideal") is IDEAL_EFFICIENCY and get_efficiency("fitted") is DEFAULT_EFFICIENCY
    assert stage_time_s(w, NPU, efficiency=DEFAULT_EFFICIENCY) > t  # fitted < 1 and launches


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("efficiency", ["ideal", "fitted"])
def test_stage_time_non_increasing_in_f_and_b(stage: str, efficiency: str) -> None:
    eff = get_efficiency(efficiency)
    for name in ("deepseek-v4-flash", "llama-3.1-405b"):
        w = stage_work(get_model(name), stage, batch=16, context_len=8000)  # type: ignore[arg-type]
        for tflops in (25.0, 250.0, 2500.0, 20000.0):
            times = [
                stage_time_s(
                    w, dataclasses.replace(NPU, compute_tflops=tflops, bandwidth_gbs=bw), efficiency=eff
                )
                for bw in (200.0, 1000.0, 8000.0, 150000.0)
            ]
            assert all(a >= b for a, b in zip(times, times[1:]))
        for bw in (200.0, 8000.0):
            times = [
                stage_time_s(w, dataclasses.replace(NPU, compute_tflops=f, bandwidth_gbs=bw), efficiency=eff)
                for f in (25.0, 250.0, 2500.0, 20000.0)
            ]
            assert all(a >= b for a, b in zip(times, times[1:]))


def test_bad_inputs_name_the_value() -> None:
    model = get_model("glm-4.6")
    with pytest.raises(ConfigError, match="stage='xa'"):
        stage_work(model, "xa", batch=1, context_len=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="bits=32"):
        stage_work(model, "pa", batch=1, context_len=1, bits=32)
    with pytest.raises(ConfigError, match="batch=-1"):
        stage_work(model, "da", batch=-1, context_len=1)


@pytest.mark.parametrize("name", ["qwen2.5-32b", "smollm2-135m"])
def test_decode_attention_matches_the_roofline_counting(name: str) -> None:
    """For a uniform GQA model with 16-bit KV the stage model counts what cost/roofline.py
    counts: the same KV bytes read + written and the same attention FLOPs, summed over layers."""
    from dualpath.cost.shapes import decode_attention_flops, kv_layer_bytes

    model = get_model(name)
    assert model.kv_dtype_bytes == 2
    contexts = [7000] * 16
    w = stage_work(model, "da", batch=16, context_len=7000)
    per_layer = sum(kv_layer_bytes(model, c) for c in contexts) + 16 * model.kv_bytes_per_token_layer
    assert w.kv_read_bytes + w.kv_write_bytes == model.num_layers * per_layer
    main, indexer = decode_attention_flops(model, contexts)
    assert w.attention_flops == model.num_layers * (main + indexer)
    f = stage_work(model, "df", batch=16, context_len=7000)
    assert math.isclose(
        w.flops + f.flops - w.attention_flops, 16 * model.linear_flops_per_token, rel_tol=1e-12
    )


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(sorted(MODELS)),
    stage=st.sampled_from(STAGES),
    batch=st.integers(0, 600),
    context=st.integers(0, 300_000),
    tflops=st.floats(1.0, 30000.0),
    gbs=st.floats(10.0, 200000.0),
    up_f=st.floats(1.0, 100.0),
    up_b=st.floats(1.0, 100.0),
)
def test_stage_work_properties(
    name: str, stage: str, batch: int, context: int, tflops: float, gbs: float, up_f: float, up_b: float
) -> None:
    model = get_model(name)
    works = [
        stage_work(model, stage, batch=batch, context_len=context, bits=b)  # type: ignore[arg-type]
        for b in (4, 8, 16)
    ]
    assert works[0].flops == works[1].flops == works[2].flops >= 0
    for w in works:
        for term in (w.weight_bytes, w.kv_read_bytes, w.kv_write_bytes, w.act_bytes):
            assert term >= 0
        assert 0.0 <= w.kv_share() <= 1.0
    w = works[2]
    dev = dataclasses.replace(NPU, compute_tflops=tflops, bandwidth_gbs=gbs)
    faster = dataclasses.replace(dev, compute_tflops=tflops * up_f, bandwidth_gbs=gbs * up_b)
    assert stage_time_s(w, faster) <= stage_time_s(w, dev)
    assert stage_time_s(w, faster, efficiency=DEFAULT_EFFICIENCY) <= stage_time_s(
        w, dev, efficiency=DEFAULT_EFFICIENCY
    )


@pytest.mark.parametrize("name", ["glm-4.6", "deepseek-v4-flash", "gpt-oss-120b", "llama-4-scout"])
def test_prefill_chunks_add_up_to_the_whole_prompt(name: str) -> None:
    """A chunked prefill (stage_work cached_len) does the whole prompt's FLOPs and writes its KV
    over its chunks; later chunks read the prefix's KV; merge_works streams the weights once."""
    from dualpath.cost.stages import merge_works

    model = get_model(name)
    whole = stage_work(model, "pa", batch=1, context_len=6000)
    parts = [
        stage_work(model, "pa", batch=1, context_len=n, cached_len=done)
        for done, n in ((0, 2000), (2000, 2500), (4500, 1500))
    ]
    assert sum(p.flops for p in parts) == pytest.approx(whole.flops, rel=1e-12)
    assert sum(p.attention_flops for p in parts) == pytest.approx(whole.attention_flops, rel=1e-12)
    assert sum(p.kv_write_bytes for p in parts) == pytest.approx(whole.kv_write_bytes, rel=1e-12)
    assert parts[0].kv_read_bytes == 0 and parts[2].kv_read_bytes > parts[1].kv_read_bytes > 0
    dec = stage_work(model, "da", batch=32, context_len=6000)
    mixed = merge_works([*parts, dec])
    assert mixed.weight_bytes == whole.weight_bytes  # the A weights once, not four times
    assert mixed.flops == pytest.approx(sum(p.flops for p in parts) + dec.flops, rel=1e-12)
    assert mixed.kv_read_bytes == pytest.approx(sum(p.kv_read_bytes for p in (*parts, dec)), rel=1e-12)
    with pytest.raises(ConfigError, match="cached_len"):
        stage_work(model, "pa", batch=1, context_len=10, cached_len=-1)

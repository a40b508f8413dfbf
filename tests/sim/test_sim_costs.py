"""The simulator's step times: the cost model as is (no per-token multipliers), the measured kernel
tables (a data folder's or the bundled ones), the roofline (said so) for a GPU without them; fixed
per-step terms added once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import dualpath
from dualpath.core.errors import ConfigError
from dualpath.core.paths import DATA_DIR_ENV
from dualpath.cost import make_cost_model
from dualpath.sim.calibration import DEFAULT_CALIBRATION, Calibration
from dualpath.sim.config import SimConfig, get_system
from dualpath.sim.costs import CostCache
from dualpath.sim.harness.runner import run_one
from dualpath.spec.hardware import get_gpu
from dualpath.spec.models import MODELS

SRC = Path(dualpath.__file__).parent


def test_time_scale_multipliers_are_gone_from_the_code() -> None:
    names = {f for f in Calibration.__dataclass_fields__}
    assert not {"prefill_time_scale", "decode_time_scale"} & names
    pattern = re.compile(r"(PREFILL|DECODE)_TIME_SCALE|(prefill|decode)_time_scale|_(prefill|decode)_scale")
    hits = [str(p) for p in SRC.rglob("*.py") if pattern.search(p.read_text(encoding="utf-8"))]
    assert hits == []


def _cache(
    name: str, model: str = "deepseek-v3.2", pe: int = 16, de: int = 32, gpu: str = "h100", **kw
) -> CostCache:
    return CostCache(
        MODELS[model], get_gpu(gpu), name=name, pe_ep_size=pe, de_ep_size=de, num_gpus_per_node=8, **kw
    )


def test_steps_are_the_cost_model_plus_the_fixed_terms() -> None:
    cal = DEFAULT_CALIBRATION
    cache = _cache("roofline")
    model = MODELS["deepseek-v3.2"]
    de = make_cost_model("roofline", get_gpu("h100"), ep_size=32, num_gpus_per_node=8)
    lens = [8192 + 512] * 16
    fixed = cal.decode_step_overhead_s + model.num_moe_layers * cal.ep_layer_latency_rdma_s
    # + the all-to-all bytes of the GPU's 16 tokens over DeepEP's low-latency bandwidths at EP 32
    # (48 / 53 GB/s): 8 selections of 7,408 B (FP8 + scales + header) out, 14,336 B (BF16) back
    per_token = model.num_moe_layers * 8 * (7408 / 48e9 + 14336 / 53e9)
    expected = de.decode_step_time_s(model, lens) + fixed + 16 * per_token
    assert cache.decode_step_s(16, 16 * 8704) == pytest.approx(expected)
    assert cache.describe()["decode_a2a_s_per_token"] == pytest.approx(per_token)
    terms = cache.decode_terms_s(16, 8704)
    assert sum(terms.values()) == pytest.approx(expected)
    assert terms["a2a_bytes"] == pytest.approx(16 * per_token)
    pe_fixed = cal.prefill_iter_overhead_s + model.num_moe_layers * cal.ep_layer_latency_rdma_s
    assert cache.iteration_s(0.01) == pytest.approx(0.01 * model.num_layers + pe_fixed)
    # an EP group inside one node: decode (DeepEP's low-latency kernels, pure RDMA) pays the same
    # floor, prefill (normal kernels over NVLink) the NVLink latency; no EP, none
    small = _cache("roofline", "ds-27b", 8, 8)
    layers = MODELS["ds-27b"].num_moe_layers
    assert small.describe()["decode_fixed_s"] == pytest.approx(
        cal.decode_step_overhead_s + layers * cal.ep_layer_latency_rdma_s
    )
    assert small.describe()["prefill_fixed_s"] == pytest.approx(
        cal.prefill_iter_overhead_s + layers * cal.ep_layer_latency_nvlink_s
    )
    dense = _cache("roofline", "qwen2.5-32b", 1, 1)
    assert dense.describe()["decode_fixed_s"] == pytest.approx(cal.decode_step_overhead_s)


def test_without_tables_the_roofline_runs_and_says_why(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    cache = _cache("auto", gpu="a100")  # no tables in the data folder, none bundled
    assert cache.source.startswith("roofline (auto: calibrated unavailable") and DATA_DIR_ENV in cache.source
    with pytest.raises(ConfigError):  # asked for by name, the tables must be there
        _cache("calibrated", gpu="a100")


def test_a_bare_clone_runs_the_bundled_tables(monkeypatch, tmp_path, make_cluster, make_trajectories) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))  # a data folder without kernel tables
    cache = _cache("auto")
    assert cache.source == "calibrated (bundled h100_sxm.npz)"
    res = run_one(SimConfig(system=get_system("dualpath"), cluster=make_cluster()), make_trajectories(4))
    assert res["cost_model"] == "calibrated (bundled h100_sxm.npz)"


def test_tp_engines_run_the_roofline() -> None:
    cache = _cache("auto", "qwen2.5-32b", 1, 1, tp_size=2)
    assert cache.source.startswith("roofline (calibrated not used") and "TP-2" in cache.source


def test_with_tables_the_steps_come_from_them(make_cluster, make_trajectories) -> None:
    cache = _cache("auto")
    assert cache.source.startswith("calibrated (")
    # decode grows with the batch (measured MoE and attention kernels)
    steps = [cache.decode_step_s(b, b * 32768) for b in (1, 8, 32, 64)]
    assert steps == sorted(steps) and steps[-1] > steps[0]
    cov = cache.describe()["decode"]["coverage"]  # filled as ops are first looked up
    assert "generation_mla_perf" in cov["deepseek-v3.2/decode_attn"]
    assert "moe_perf" in cov["deepseek-v3.2/moe"]
    res = run_one(SimConfig(system=get_system("dualpath"), cluster=make_cluster()), make_trajectories(4))
    assert res["cost_model"].startswith("calibrated (")


def test_deepep_bandwidths_reproduce_its_published_latencies() -> None:
    """DeepEP's README: 128 tokens per GPU at EP 32 dispatch in 155 us and combine in 273 us
    (H800, CX7 400 Gb/s); the bytes over its published bandwidths give the same times (the floor
    the simulator adds is what the paper's engine has beyond them)."""
    from dualpath.sim.ep_comm import ll_bandwidth_bytes_per_s, ll_selection_bytes

    model = MODELS["deepseek-v3.2"]
    d_bytes, c_bytes = ll_selection_bytes(model)
    d_bw, c_bw = ll_bandwidth_bytes_per_s(32)
    assert 128 * 8 * d_bytes / d_bw == pytest.approx(155e-6, rel=0.03)
    assert 128 * 8 * c_bytes / c_bw == pytest.approx(273e-6, rel=0.03)
    assert ll_bandwidth_bytes_per_s(48) == ll_bandwidth_bytes_per_s(32)  # the next smaller row
    assert ll_bandwidth_bytes_per_s(32, 800.0)[0] == pytest.approx(2 * d_bw)  # scales with the CNIC
    # inside one node (DS 27B's EP 8) the bytes go at DeepEP's EP 8 bandwidths; without EP, none
    small = MODELS["ds-27b"]
    d_bytes, c_bytes = ll_selection_bytes(small)
    d_bw, c_bw = ll_bandwidth_bytes_per_s(8)
    per_token = small.num_moe_layers * small.num_active_experts * (d_bytes / d_bw + c_bytes / c_bw)
    assert _cache("roofline", "ds-27b", 8, 8).describe()["decode_a2a_s_per_token"] == pytest.approx(per_token)
    assert _cache("roofline", "qwen2.5-32b", 1, 1).describe()["decode_a2a_s_per_token"] == 0.0

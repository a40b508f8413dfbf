from __future__ import annotations

import math
from pathlib import Path

import pytest

from dualpath.core.errors import ConfigError
from dualpath.cost import make_cost_model
from dualpath.cost.shapes import model_shape
from dualpath.cost.tables import DATA_DIR_ENV, Curve, PerfTables, perf_db_dir, resolve_data_dir, select
from dualpath.spec.hardware import get_gpu
from dualpath.spec.models import MODELS, get_model

TEST_DATA_DIR = Path(__file__).resolve().parents[1] / "data"

# The calibrated tests read the shipped H100 slice (tests/data: the rows of the shapes below);
# test_every_table_model_runs_calibrated and test_slice_matches_full_tables need the full tables.


@pytest.fixture(scope="module")
def h100_tables() -> PerfTables:
    return PerfTables(perf_db_dir(TEST_DATA_DIR, "h100"))


@pytest.fixture(scope="module")
def cal16(h100):  # type: ignore[no-untyped-def]
    return make_cost_model("calibrated", h100, ep_size=16)


def _row_s(frame, **equal) -> float:  # type: ignore[no-untyped-def]
    rows = frame
    for column, value in equal.items():
        rows = rows[rows[column] == value]
    assert len(rows) >= 1, equal
    return float(rows["latency"].mean()) * 1e-3


def test_gemm_rows_at_table_points(cal16, h100_tables, ds32) -> None:  # type: ignore[no-untyped-def]
    frame = h100_tables.frame("gemm", "gemm_perf")
    factor = model_shape(ds32).replicated_weight_bytes_layer / (7168 * 7168)
    for m in (1, 64, 4096, 16384):
        expected = _row_s(frame, gemm_dtype="fp8_block", m=m, n=7168, k=7168) * factor
        assert cal16.dense_op_s(ds32, m) == pytest.approx(expected, rel=1e-9)


def test_moe_rows_at_table_points(cal16, h100_tables, ds32) -> None:  # type: ignore[no-untyped-def]
    frame = h100_tables.frame("moe", "moe_perf")
    fraction = model_shape(ds32).moe_layer_fraction
    for tokens in (1, 512, 16384):
        row = _row_s(
            frame,
            moe_dtype="fp8_block",
            num_tokens=tokens,
            hidden_size=7168,
            inter_size=2048,
            topk=8,
            num_experts=256,
            moe_tp_size=1,
            moe_ep_size=16,
            distribution="balanced",
        )
        assert cal16.moe_op_s(ds32, tokens) == pytest.approx(row * fraction, rel=1e-9)


def test_decode_attention_rows_at_table_points(h100, h100_tables) -> None:  # type: ignore[no-untyped-def]
    v3 = get_model("deepseek-v3")  # dense MLA: the generation_mla row directly
    cost = make_cost_model("calibrated", h100, ep_size=16)
    frame = h100_tables.frame("mla", "generation_mla_perf")
    row = _row_s(frame, num_heads=128, tp_size=1, kv_cache_dtype="fp8", batch_size=64, step=32767)
    assert cost.decode_attention_layer_s(v3, [32767] * 64) == pytest.approx(row, rel=1e-9)
    qwen = get_model("qwen2.5-32b")
    frame = h100_tables.frame("attention", "generation_attention_perf")
    row = _row_s(
        frame,
        num_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        window_size=0,
        kv_cache_dtype="bfloat16",
        batch_size=16,
        step=8191,
    )
    assert cost.decode_attention_layer_s(qwen, [8191] * 16) == pytest.approx(row, rel=1e-9)


def test_prefill_attention_row_without_cache(h100, h100_tables) -> None:  # type: ignore[no-untyped-def]
    qwen = get_model("qwen2.5-32b")
    cost = make_cost_model("calibrated", h100)
    frame = h100_tables.frame("attention", "context_attention_perf")
    row = _row_s(
        frame,
        num_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        window_size=0,
        attn_dtype="bfloat16",
        kv_cache_dtype="bfloat16",
        batch_size=4,
        isl=4096,
    )
    assert cost.prefill_attention_layer_s(qwen, [(0, 4096)] * 4) == pytest.approx(row, rel=1e-6)


def test_interpolation_between_points(cal16, h100_tables, ds32) -> None:  # type: ignore[no-untyped-def]
    frame = h100_tables.frame("gemm", "gemm_perf")
    lo = _row_s(frame, gemm_dtype="fp8_block", m=8192, n=7168, k=7168)
    hi = _row_s(frame, gemm_dtype="fp8_block", m=16384, n=7168, k=7168)
    factor = model_shape(ds32).replicated_weight_bytes_layer / (7168 * 7168)
    mid = cal16.dense_op_s(ds32, int(math.sqrt(8192 * 16384))) / factor
    assert min(lo, hi) < mid < max(lo, hi)
    assert mid == pytest.approx(math.sqrt(lo * hi), rel=1e-3)  # log-log midpoint


def test_curve_edges() -> None:
    curve = Curve.from_points([(1, 2.0), (10, 20.0), (100, 100.0), (10, 40.0)])
    assert curve(0.5) == 2.0  # floor below the range
    assert curve(10) == 30.0  # repeated x averaged
    assert curve(200) == pytest.approx(200.0)  # proportional above the range
    with pytest.raises(ConfigError):
        Curve.from_points([])


def test_fallbacks_and_scaled_ep_are_recorded(h100) -> None:  # type: ignore[no-untyped-def]
    cost = make_cost_model("calibrated", h100, ep_size=24)
    oss, ds = get_model("gpt-oss-120b"), get_model("deepseek-v3.2")
    cost.prefill_iteration_time_s(oss, [(4096, 256)])
    cost.decode_step_time_s(ds, [4096] * 8)
    cov = cost.describe()["coverage"]
    assert cov["gpt-oss-120b/prefill_attn"].startswith("roofline: windowed")
    assert cov["deepseek-v3.2/moe"] == "moe_perf fp8_block ep=16 scaled to ep=24"
    assert cov["deepseek-v3.2/decode_attn"].startswith("generation_mla_perf")


def test_calibrated_close_to_roofline_and_monotonic(h100, cal16, roofline_ep16, ds32) -> None:  # type: ignore[no-untyped-def]
    items = [(32768, 429)] * 8
    ratio = cal16.prefill_iteration_time_s(ds32, items) / roofline_ep16.prefill_iteration_time_s(ds32, items)
    assert 0.5 < ratio < 2.0
    times = [cal16.prefill_iteration_time_s(ds32, [(c, 429)] * 4) for c in (0, 8192, 65536)]
    assert times == sorted(times)
    steps = [cal16.decode_step_time_s(ds32, [8192] * b) for b in (1, 16, 128, 512)]
    assert steps == sorted(steps)


def test_missing_data_is_a_config_error(h100, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    shipped = resolve_data_dir()  # tests/data (tests/conftest.py)
    a100 = get_gpu("a100")  # no tables in a data folder, none bundled
    with pytest.raises(ConfigError, match=str(tmp_path)):
        make_cost_model("calibrated", a100, data_dir=tmp_path)
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="nowhere"):
        make_cost_model("calibrated", a100)
    # H100 tables are bundled: a data folder without them falls back to the archive
    assert make_cost_model("calibrated", h100).tables.bundled  # type: ignore[attr-defined]
    monkeypatch.setenv(DATA_DIR_ENV, str(shipped))
    cost = make_cost_model("calibrated", h100)
    assert cost.name == "calibrated" and not cost.tables.bundled  # type: ignore[attr-defined]


def test_frame_select_and_mask(h100_tables) -> None:  # type: ignore[no-untyped-def]
    frame = h100_tables.frame("gemm", "gemm_perf")
    assert {"gemm_dtype", "m", "n", "k", "latency"} <= set(frame.columns)
    rows = select(frame, gemm_dtype="bfloat16", n=5120)
    assert rows is not None and 0 < len(rows) < len(frame)
    assert set(rows["gemm_dtype"].tolist()) == {"bfloat16"} and set(rows["n"].tolist()) == {5120}
    assert select(frame, gemm_dtype="no-such-dtype") is None
    assert select(frame, no_such_column=1) is None
    assert h100_tables.frame("gemm", "no_such_table") is None


@pytest.mark.parametrize("gpu_name", ["h100", "h200", "b200"])
def test_every_table_model_runs_calibrated(gpu_name, reference_data) -> None:  # type: ignore[no-untyped-def]
    if not (reference_data / "hardware" / "aiconfigurator-perf-db" / f"{gpu_name}_sxm").is_dir():
        pytest.skip(f"no {gpu_name} tables under {reference_data}")
    for name, model in MODELS.items():
        cost = make_cost_model("calibrated", get_gpu(gpu_name), ep_size=16 if model.is_moe else 1)
        prefill = cost.prefill_iteration_time_s(model, [(8192, 256)] * 2)
        decode = cost.decode_step_time_s(model, [8192] * 4)
        assert 0 < decode < prefill < 60, (name, prefill, decode)


@pytest.mark.parametrize("model_name", ["deepseek-v3.2", "deepseek-v3", "qwen2.5-32b", "gpt-oss-120b"])
def test_slice_matches_full_tables(model_name, h100, reference_data) -> None:  # type: ignore[no-untyped-def]
    """The shipped slice holds every row the tests' models look up: same times as the full tables."""
    model = get_model(model_name)
    for ep in (1, 16, 24):
        full = make_cost_model("calibrated", h100, ep_size=ep, data_dir=reference_data)
        cut = make_cost_model("calibrated", h100, ep_size=ep, data_dir=TEST_DATA_DIR)
        for items in ([(0, 4096)] * 2, [(32768, 429)] * 8):
            assert cut.prefill_iteration_time_s(model, items) == full.prefill_iteration_time_s(model, items)
        for batch in (1, 64, 512):
            assert cut.decode_step_time_s(model, [8192] * batch) == full.decode_step_time_s(
                model, [8192] * batch
            )
        assert cut.describe()["coverage"] == full.describe()["coverage"]


def test_gpu_without_tables(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="a100_sxm"):
        make_cost_model("calibrated", get_gpu("a100"))

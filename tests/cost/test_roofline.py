from __future__ import annotations

import pytest

from dualpath.core.errors import ConfigError, UnknownNameError
from dualpath.cost import DEFAULT_EFFICIENCY, CostModel, Efficiency, make_cost_model
from dualpath.cost.efficiency import roofline_s
from dualpath.cost.shapes import model_shape
from dualpath.spec.models import get_model

EFF = DEFAULT_EFFICIENCY


def test_gemm_by_hand_on_h100() -> None:
    # 8192^3 BF16 GEMM: 2 x 8192^3 FLOPs at 989 TFLOPS x 0.75, plus one 3 us launch.
    flops = 2.0 * 8192**3
    weights = 8192 * 8192 * 2.0
    t = roofline_s(flops, weights, 989e12, 3350e9, EFF.gemm_bf16_compute, EFF.gemm_memory, 1, 3e-6)
    assert t == pytest.approx(flops / (989e12 * 0.75) + 3e-6, rel=1e-12)
    assert t == pytest.approx(1.4853e-3, rel=1e-3)
    # m = 1: weight-streaming, bytes / (3.35 TB/s x 0.70)
    t1 = roofline_s(2.0 * 8192 * 8192, weights, 989e12, 3350e9, 0.75, 0.70, 0, 0.0)
    assert t1 == pytest.approx(weights / (3350e9 * 0.70), rel=1e-12)


def test_dense_layer_compute_and_memory_regimes(h100, dense_model) -> None:  # type: ignore[no-untyped-def]
    model = dense_model
    cost = make_cost_model("roofline", h100)
    shape = model_shape(model)
    launches = EFF.dense_kernels * EFF.kernel_launch_s
    big = 65536
    expected = big * model.linear_flops_per_token / model.num_layers / (989e12 * 0.75) + launches
    assert cost.dense_op_s(model, big) == pytest.approx(expected, rel=1e-9)
    one = shape.replicated_weight_bytes_layer / (3350e9 * 0.70) + launches
    assert cost.dense_op_s(model, 1) == pytest.approx(one, rel=1e-9)


def test_satisfies_protocol_and_describes(roofline_ep16) -> None:  # type: ignore[no-untyped-def]
    assert isinstance(roofline_ep16, CostModel)
    info = roofline_ep16.describe()
    assert info["name"] == "roofline" and info["ep_size"] == 16 and info["gpu"] == "h100"


def test_iteration_is_layers_times_layer_sum(roofline_ep16, ds32) -> None:  # type: ignore[no-untyped-def]
    items = [(32768, 429)] * 8
    attn, other = roofline_ep16.prefill_layer_times_s(ds32, items)
    assert roofline_ep16.prefill_iteration_time_s(ds32, items) == pytest.approx(61 * (attn + other))
    a, o = roofline_ep16.decode_layer_times_s(ds32, [32768] * 64)
    assert roofline_ep16.decode_step_time_s(ds32, [32768] * 64) == pytest.approx(61 * (a + o))


@pytest.mark.parametrize("name", ["deepseek-v3.2", "qwen2.5-32b", "gpt-oss-120b", "ds-27b"])
def test_monotonic_in_tokens_context_and_batch(h100, name) -> None:  # type: ignore[no-untyped-def]
    model = get_model(name)
    cost = make_cost_model("roofline", h100, ep_size=8 if model.is_moe else 1)
    prefill = cost.prefill_iteration_time_s
    for cached in (0, 4096, 32768):
        times = [prefill(model, [(cached, n)]) for n in (1, 64, 429, 4096, 16384)]
        assert times == sorted(times) and times[-1] > times[0]
    for new in (1, 429):
        times = [prefill(model, [(c, new)]) for c in (0, 1024, 16384, 65536)]
        assert times == sorted(times)
    batches = [prefill(model, [(16384, 429)] * b) for b in (1, 2, 8, 32)]
    assert batches == sorted(batches) and batches[-1] > batches[0]
    decode = [cost.decode_step_time_s(model, [c] * 8) for c in (1, 1024, 32768, 131072)]
    assert decode == sorted(decode)
    decode_b = [cost.decode_step_time_s(model, [8192] * b) for b in (1, 16, 64, 256)]
    assert decode_b == sorted(decode_b) and decode_b[-1] > decode_b[0]


def test_dsa_caps_attention_growth(h100) -> None:  # type: ignore[no-untyped-def]
    sparse, dense = get_model("deepseek-v3.2"), get_model("deepseek-v3")
    cost = make_cost_model("roofline", h100, ep_size=16)

    def growth(model):  # type: ignore[no-untyped-def]
        short = cost.prefill_layer_times_s(model, [(8192, 429)])[0]
        long = cost.prefill_layer_times_s(model, [(65536, 429)])[0]
        return long / short

    assert growth(dense) > 6.0  # ~8x more keys per query
    assert growth(sparse) < 0.6 * growth(dense)  # only the indexer still grows
    # decode: the main KV read is capped at top-k tokens, only indexer keys grow
    d_sparse = cost.decode_layer_times_s(sparse, [131072] * 64)[0]
    d_dense = cost.decode_layer_times_s(dense, [131072] * 64)[0]
    assert d_sparse < 0.35 * d_dense


def test_prefill_is_io_bound_on_the_papers_node(roofline_ep16, ds32) -> None:  # type: ignore[no-untyped-def]
    # 8 GPUs of a node each prefill 8 x (32K cached, 429 new); the node's one 400 Gbps SNIC
    # (50 GB/s) must bring in the 64 requests' KV. The paper's premise: loading dominates.
    iteration_s = roofline_ep16.prefill_iteration_time_s(ds32, [(32768, 429)] * 8)
    load_s = 64 * ds32.kv_bytes(32768) / 50e9
    assert iteration_s < 0.5 * load_s
    # per request on one GPU the 429-token compute is far below the 1.3 GB KV at 50 GB/s / 8 GPUs
    single_s = roofline_ep16.prefill_iteration_time_s(ds32, [(32768, 429)])
    assert single_s < ds32.kv_bytes(32768) / (50e9 / 8)


def test_group_tokens_raise_moe_time(roofline_ep16, ds32) -> None:  # type: ignore[no-untyped-def]
    items = [(4096, 256)] * 4
    balanced = roofline_ep16.prefill_layer_times_s(ds32, items)[1]
    hot = roofline_ep16.prefill_layer_times_s(ds32, items, group_num_tokens=4 * 256 * 64)[1]
    assert hot > balanced
    with pytest.raises(ConfigError, match="group_num_tokens"):
        roofline_ep16.prefill_layer_times_s(ds32, items, group_num_tokens=10)


@pytest.mark.parametrize(
    "items",
    [[], [(0, 0)], [(-1, 5)], [(10, 2.5)], [(1, 2, 3)]],
)
def test_bad_prefill_items(roofline_ep16, ds32, items) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="items"):
        roofline_ep16.prefill_iteration_time_s(ds32, items)


@pytest.mark.parametrize("contexts", [[], [0], [-3], [1.5]])
def test_bad_decode_contexts(roofline_ep16, ds32, contexts) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="context_lens"):
        roofline_ep16.decode_step_time_s(ds32, contexts)


def test_bad_config(h100) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnknownNameError, match="roofline, calibrated|calibrated, roofline"):
        make_cost_model("magic", h100)
    with pytest.raises(ConfigError, match="ep_size"):
        make_cost_model("roofline", h100, ep_size=0)
    with pytest.raises(ConfigError, match="gemm_fp8_compute"):
        Efficiency(gemm_fp8_compute=1.5)


def test_numpy_ints_accepted(roofline_ep16, ds32) -> None:  # type: ignore[no-untyped-def]
    np = pytest.importorskip("numpy")
    a = roofline_ep16.prefill_iteration_time_s(ds32, [(np.int64(1024), np.int64(64))])
    assert a == roofline_ep16.prefill_iteration_time_s(ds32, [(1024, 64)])


def test_every_table_model_runs(h100) -> None:  # type: ignore[no-untyped-def]
    from dualpath.spec.models import MODELS

    for name, model in MODELS.items():
        cost = make_cost_model("roofline", h100, ep_size=16 if model.is_moe else 1)
        prefill = cost.prefill_iteration_time_s(model, [(8192, 256)] * 2)
        decode = cost.decode_step_time_s(model, [8192] * 4)
        assert 0 < decode < prefill < 60, (name, prefill, decode)


def test_windowed_and_compressed_kv_reads_are_smaller(h100) -> None:  # type: ignore[no-untyped-def]
    # gpt-oss keeps 128 tokens in its windowed half of the layers: decode reads about half the KV
    oss = get_model("gpt-oss-120b")
    cost = make_cost_model("roofline", h100, ep_size=8)
    from dualpath.cost.shapes import kv_layer_bytes

    full = 65536 * oss.kv_bytes_per_token_layer
    assert kv_layer_bytes(oss, 65536) == pytest.approx(oss.kv_bytes(65536) / oss.num_layers)
    assert 0.45 * full < kv_layer_bytes(oss, 65536) < 0.55 * full
    assert cost.decode_step_time_s(oss, [65536] * 8) > cost.decode_step_time_s(oss, [1024] * 8)

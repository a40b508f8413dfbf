from __future__ import annotations

import pytest

from dualpath.core.errors import ConfigError
from dualpath.cost import fit_attention_predictor, make_cost_model, model_traffic_bytes, weight_bytes_per_gpu
from dualpath.cost.predictor import grid_batches
from dualpath.cost.traffic import remote_nodes_per_token
from dualpath.spec.models import get_model


def test_predictor_matches_policy_protocol(roofline_ep16, ds32) -> None:  # type: ignore[no-untyped-def]
    policy = pytest.importorskip("dualpath.policy.predictor")
    predictor = roofline_ep16.attention_predictor(ds32)
    assert policy.is_attention_predictor(predictor)
    main, indexer = ds32.attention_flops_layer(32768, 429), 0.0
    indexer = (32768 * 429 + 429 * 430 // 2) * ds32.indexer_flops_per_pair
    # BF16-equivalent: the FP8 indexer counts half on Hopper
    assert predictor.attention_flops(32768, 429) == pytest.approx(main - indexer / 2)
    qwen = get_model("qwen2.5-32b")
    plain = make_cost_model("roofline", roofline_ep16.gpu).attention_predictor(qwen)
    assert plain.attention_flops(1000, 10) == qwen.attention_flops_layer(1000, 10)


def test_predictor_fits_its_cost_model(roofline_ep16, ds32) -> None:  # type: ignore[no-untyped-def]
    predictor = roofline_ep16.attention_predictor(ds32)
    assert predictor.max_rel_error < 0.05  # roofline attention is compute-bound: near linear
    for batch in ([(32768, 429)] * 8, [(1024, 4096)], [(65536, 64)] * 3):
        flops = sum(predictor.attention_flops(c, n) for c, n in batch)
        actual = roofline_ep16.prefill_layer_times_s(ds32, batch)[0]
        assert predictor.predict_s(flops) == pytest.approx(actual, rel=0.05)
    assert predictor.predict_s(0.0) == 0.0
    values = [predictor.predict_s(f) for f in (1e9, 1e11, 1e13)]
    assert values == sorted(values)


def test_predictor_on_calibrated_and_dense_models(h100) -> None:  # type: ignore[no-untyped-def]
    qwen = get_model("qwen2.5-32b")
    cost = make_cost_model("roofline", h100)
    predictor = cost.attention_predictor(qwen)
    assert predictor.source == "roofline" and predictor.seconds_per_flop > 0
    with pytest.raises(ConfigError, match="batches"):
        fit_attention_predictor(cost, qwen, [[(0, 64)]])
    assert len(grid_batches()) == 6 * 5 * 3


def test_traffic_bytes(ds32) -> None:  # type: ignore[no-untyped-def]
    assert model_traffic_bytes(ds32, 1000, ep_size=8) == 0.0  # one node: NVLink only
    assert model_traffic_bytes(get_model("qwen2.5-32b"), 1000, ep_size=16) == 0.0  # dense
    two_nodes = model_traffic_bytes(ds32, 1000, ep_size=16)
    # 2 nodes, top-8: the other node is hit with probability 1 - 0.5^8; 3 B/hidden value
    expected = 1000 * 58 * 7168 * 3.0 * (2 * (1 - 0.5**8)) * 0.5
    assert two_nodes == pytest.approx(expected)
    assert model_traffic_bytes(ds32, 2000, ep_size=16) == pytest.approx(2 * two_nodes)
    # node-limited routing: never more than 4 nodes per token, however large the group
    assert remote_nodes_per_token(144 * 8, 8, 8) <= 4.0
    assert remote_nodes_per_token(32, 8, 8) > remote_nodes_per_token(16, 8, 8)
    with pytest.raises(ConfigError, match="num_tokens"):
        model_traffic_bytes(ds32, -1, ep_size=16)


def test_weight_bytes_per_gpu(ds32) -> None:  # type: ignore[no-untyped-def]
    assert weight_bytes_per_gpu(ds32, 1) == pytest.approx(ds32.weight_bytes, rel=1e-9)
    per_gpu = [weight_bytes_per_gpu(ds32, ep) for ep in (8, 16, 32)]
    assert per_gpu == sorted(per_gpu, reverse=True)
    assert per_gpu[0] > 80e9 > per_gpu[1]  # 671 GB of FP8 needs EP >= 16 on 80 GB GPUs
    qwen = get_model("qwen2.5-32b")
    assert 60e9 < weight_bytes_per_gpu(qwen) < 80e9  # BF16 replica fits one H100 (DP)
    with pytest.raises(ConfigError, match="ep_size"):
        weight_bytes_per_gpu(qwen, 0)


def test_rates(roofline_ep16, ds32) -> None:  # type: ignore[no-untyped-def]
    from dualpath.cost import decode_tokens_per_s, prefill_tokens_per_s

    rate = prefill_tokens_per_s(roofline_ep16, ds32)
    assert rate == pytest.approx(8 * 429 / roofline_ep16.prefill_iteration_time_s(ds32, [(32768, 429)] * 8))
    assert prefill_tokens_per_s(roofline_ep16, ds32, cached_len=0) > rate  # less attention
    assert decode_tokens_per_s(roofline_ep16, ds32, batch_size=128) > decode_tokens_per_s(
        roofline_ep16, ds32, batch_size=8
    )
    with pytest.raises(ConfigError, match="num_requests"):
        prefill_tokens_per_s(roofline_ep16, ds32, num_requests=0)

"""Ablation transforms (planner/ablation.py): validated replaces with totals from shapes."""

from __future__ import annotations

import pytest

from dualpath.core.errors import ConfigError, UnknownNameError
from dualpath.cost.stages import stage_weight_bytes, stage_work
from dualpath.planner.ablation import apply_overrides
from dualpath.spec.models import get_model
from dualpath.spec.params import shape_active_params, shape_total_params


def test_empty_overrides_return_the_model() -> None:
    model = get_model("glm-4.6")
    assert apply_overrides(model, {}) is model


@pytest.mark.parametrize(
    "name", ["gpt-oss-120b", "glm-4.6", "deepseek-v4-flash", "llama-3.1-405b", "deepseek-v3.2"]
)
def test_kv_width_changes_kv_bytes_only(name: str) -> None:
    model = get_model(name)
    wide = apply_overrides(model, {"kv_width": 4096})
    assert wide.kv_elements_per_token_layer == 4096
    assert wide.total_params == model.total_params and wide.active_params == model.active_params
    assert wide.attention_flops(1000, 1) == model.attention_flops(1000, 1)
    assert apply_overrides(model, {"kv_lora_rank": 4096}).kv_elements_per_token_layer == 4096
    a, b = (stage_work(m, "da", batch=4, context_len=30000) for m in (model, wide))
    assert a.flops == b.flops and a.weight_bytes == b.weight_bytes and b.kv_read_bytes != a.kv_read_bytes


def test_expert_factors() -> None:
    model = get_model("deepseek-v4-flash")
    active = apply_overrides(model, {"active_experts_x": 4})
    assert active.num_active_experts == 4 * model.num_active_experts
    assert active.num_routed_experts == model.num_routed_experts
    assert active.total_params == model.total_params
    assert (
        active.active_params - model.active_params
        == shape_active_params(active) - shape_active_params(model)
        > 0
    )
    df = stage_work(model, "df", batch=64, context_len=1000)
    df4 = stage_work(active, "df", batch=64, context_len=1000)
    assert df4.routed_flops == pytest.approx(4 * df.routed_flops)
    total = apply_overrides(model, {"total_experts_x": 2})
    assert total.num_routed_experts == 2 * model.num_routed_experts
    assert total.total_params - model.total_params == shape_total_params(total) - shape_total_params(model)
    assert stage_weight_bytes(total, "df")[1] == pytest.approx(2 * stage_weight_bytes(model, "df")[1])
    router = 2 * model.hidden_size * model.num_routed_experts * model.num_moe_layers * 64
    assert stage_work(total, "df", batch=64, context_len=1000).flops == pytest.approx(df.flops + router)


def test_ffn_expansion_and_dtype() -> None:
    model = get_model("glm-4.6")
    big = apply_overrides(model, {"ffn_expansion": 2})
    assert big.intermediate_size == 2 * model.intermediate_size
    assert big.moe_intermediate_size == 2 * model.moe_intermediate_size
    assert big.total_params > model.total_params
    assert (
        stage_work(big, "pa", batch=1, context_len=100).flops
        == stage_work(model, "pa", batch=1, context_len=100).flops
    )  # attention side unchanged
    half = apply_overrides(model, {"dtype_bytes": 0.5})
    assert half.dtype_bytes_override == 0.5 and not half.dtype_override_kv
    every = apply_overrides(model, {"dtype_bytes": 0.5}, dtype_scope="all")
    assert every.dtype_override_kv


def test_bad_names_and_values_are_named() -> None:
    model = get_model("glm-4.6")
    with pytest.raises(UnknownNameError, match="kv_widht"):
        apply_overrides(model, {"kv_widht": 10})
    with pytest.raises(ConfigError, match="kv_width=0"):
        apply_overrides(model, {"kv_width": 0})
    with pytest.raises(ConfigError, match="kv_width=10.5"):
        apply_overrides(model, {"kv_width": 10.5})
    with pytest.raises(ConfigError, match="active_experts_x=100"):
        apply_overrides(model, {"active_experts_x": 100})
    with pytest.raises(ConfigError, match="total_experts_x=0.01"):
        apply_overrides(model, {"total_experts_x": 0.01})
    with pytest.raises(ConfigError, match="active_experts_x=2"):
        apply_overrides(get_model("llama-3.1-405b"), {"active_experts_x": 2})  # dense
    with pytest.raises(ConfigError, match="ffn_expansion=-1"):
        apply_overrides(model, {"ffn_expansion": -1})
    with pytest.raises(ConfigError, match="dtype_bytes=16"):
        apply_overrides(model, {"dtype_bytes": 16})
    with pytest.raises(ConfigError, match="dtype_scope='kv'"):
        apply_overrides(model, {"dtype_bytes": 1, "dtype_scope": "kv"})
    with pytest.raises(ConfigError, match="ffn_expansion='x'"):
        apply_overrides(model, {"ffn_expansion": "x"})

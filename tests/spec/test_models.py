"""Model table: hand-computed KV bytes, parameter counts and FLOPs."""

from __future__ import annotations

import dataclasses

import pytest

from dualpath.core.errors import ConfigError, UnknownNameError
from dualpath.spec.models import (
    MODELS,
    get_model,
    shape_active_params,
    shape_total_params,
)

REQUIRED = {
    "deepseek-v3.2",
    "deepseek-v3",
    "ds-27b",
    "qwen2.5-32b",
    "qwen3-235b-a22b",
    "gpt-oss-120b",
    "llama-3.1-405b",
    "llama-4-scout",
    "llama-4-maverick",
    "glm-4.6",
    "smollm2-135m",
}

# KV bytes per token per layer, by hand: MLA FlashMLA FP8 = 512 + 16 + 64 x 2; GQA = 2 x kv x d x B.
KV_PER_LAYER = {
    "deepseek-v3.2": 512 + 16 + 128,
    "deepseek-v3": 656,
    "ds-27b": 656,
    "qwen2.5-32b": 2 * 8 * 128 * 2,
    "qwen3-235b-a22b": 2 * 4 * 128 * 1,
    "gpt-oss-120b": 2 * 8 * 64 * 1,
    "llama-3.1-405b": 2 * 8 * 128 * 1,
    "llama-4-scout": 2 * 8 * 128 * 1,
    "llama-4-maverick": 2 * 8 * 128 * 1,
    "glm-4.6": 2 * 8 * 128 * 1,
    "smollm2-135m": 2 * 3 * 64 * 2,
    "deepseek-r1": 656,
    "qwen3-32b": 2 * 8 * 128 * 1,
    "qwen3-235b-a22b-fp8": 2 * 4 * 128 * 1,
    "llama-3.1-8b": 2 * 8 * 128 * 1,
    "llama-3.1-70b": 2 * 8 * 128 * 1,
    "qwen3-8b": 2 * 8 * 128 * 1,
    "qwen3-30b-a3b": 2 * 4 * 128 * 1,
    "gpt-oss-20b": 2 * 8 * 64 * 1,
    "deepseek-v4-pro": 448 + 64 * 2,  # one compressed entry
    "deepseek-v4-flash": 576,
    "minimax-m2.5": 2 * 8 * 128 * 1,
    "qwen3.5-397b-a17b": 2 * 2 * 256 * 1,  # its 15 full-attention layers
    "kimi-k2.5": 656,
    "kimi-k2": 656,
    "glm-5": 656,
}
LAYERS = {
    "deepseek-v3.2": 61,
    "deepseek-v3": 61,
    "ds-27b": 30,
    "qwen2.5-32b": 64,
    "qwen3-235b-a22b": 94,
    "gpt-oss-120b": 36,
    "llama-3.1-405b": 126,
    "llama-4-scout": 48,
    "llama-4-maverick": 48,
    "glm-4.6": 92,
    "smollm2-135m": 30,
    "deepseek-v4-pro": 61,
    "deepseek-v4-flash": 43,
    "deepseek-r1": 61,
    "qwen3-32b": 64,
    "qwen3-235b-a22b-fp8": 94,
    "llama-3.1-8b": 32,
    "llama-3.1-70b": 80,
    "qwen3-8b": 36,
    "qwen3-30b-a3b": 48,
    "gpt-oss-20b": 24,
    "minimax-m2.5": 62,
    "qwen3.5-397b-a17b": 60,
    "kimi-k2.5": 61,
    "kimi-k2": 61,
    "glm-5": 78,
}


def test_table_has_every_required_model() -> None:
    assert REQUIRED <= set(MODELS)
    assert set(KV_PER_LAYER) == set(MODELS)


@pytest.mark.parametrize("name", sorted(KV_PER_LAYER))
def test_kv_bytes_per_token(name: str) -> None:
    m = get_model(name)
    assert m.kv_bytes_per_token_layer == KV_PER_LAYER[name]
    assert m.num_layers == LAYERS[name]
    if m.attention_kind != "csa":
        assert m.kv_bytes_per_token == KV_PER_LAYER[name] * LAYERS[name]
        windowed = m.window_len is not None or m.num_linear_layers
        assert m.kv_bytes(1000) == 1000 * m.kv_bytes_per_token or windowed


def test_paper_kv_figures() -> None:
    assert get_model("deepseek-v3.2").kv_bytes_per_token == 40_016
    assert get_model("qwen2.5-32b").kv_bytes_per_token == 256 * 1024


@pytest.mark.parametrize("name", sorted(KV_PER_LAYER))
def test_shape_params_match_published(name: str) -> None:
    m = get_model(name)
    assert shape_total_params(m) == pytest.approx(m.total_params, rel=0.02)
    # gpt-oss publishes active params without the input embedding (5.1B)
    active = shape_active_params(m)
    if name in ("gpt-oss-120b", "gpt-oss-20b"):
        active -= m.vocab_size * m.hidden_size
    if name == "minimax-m2.5":  # its 10B active excludes both embeddings
        active -= 2 * m.vocab_size * m.hidden_size
    assert active == pytest.approx(m.active_params, rel=0.06)


def test_qwen35_linear_attention_layers() -> None:
    # layer_types in Qwen/Qwen3.5-397B-A17B config.json: every 4th layer full attention
    m = get_model("Qwen/Qwen3.5-397B-A17B")
    assert m.num_linear_layers == 45 and not m.is_linear_layer(3) and m.is_linear_layer(0)
    assert m.kv_bytes(1000) == 15 * 1000 * 2 * 2 * 256
    # FP32 state 64 x 128 x 128 and a BF16 convolution window of 3 over 2 x 16 x 128 + 64 x 128 channels
    assert m.linear_state_bytes == 64 * 128 * 128 * 4 + (2 * 16 * 128 + 64 * 128) * 3 * 2


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("MiniMaxAI/MiniMax-M2.5", "minimax-m2.5"),
        ("Qwen/Qwen3.5-397B-A17B", "qwen3.5-397b-a17b"),
        ("moonshotai/Kimi-K2.5", "kimi-k2.5"),
        ("zhipuai/GLM-5", "glm-5"),
        ("zai-org/GLM-5-FP8", "glm-5"),
    ],
)
def test_2026_models_resolve_by_their_ids(alias: str, name: str) -> None:
    assert get_model(alias).name == name


def test_smollm2_params_exact() -> None:
    # 30 x (attn 576*(576+2*192+576) + mlp 3*576*1536) + 49152*576 (tied); norms are 576*61 extra.
    m = get_model("smollm2-135m")
    hand = 30 * (576 * (576 + 2 * 192 + 576) + 3 * 576 * 1536) + 49152 * 576
    assert shape_total_params(m) == hand
    assert m.total_params - hand == 576 * 61  # the RMSNorm weights we ignore


def test_qwen_dense_linear_flops() -> None:
    m = get_model("qwen2.5-32b")
    body = 64 * (5120 * 5120 * 2 + 2 * 5120 * 1024 + 3 * 5120 * 27648)
    assert m.linear_flops_per_token == 2 * (body + 152064 * 5120)


def test_gqa_attention_flops_causal() -> None:
    m = get_model("qwen2.5-32b")
    # 3 new tokens after 10 cached: keys 11 + 12 + 13 = 36 pairs x 4 x 40 x 128 per layer
    assert m.attention_flops_layer(10, 3) == 36 * 4 * 40 * 128
    assert m.attention_flops(10, 3) == 64 * 36 * 4 * 40 * 128
    assert m.prefill_flops(10, 3) == 3 * m.linear_flops_per_token + m.attention_flops(10, 3)


def test_dsa_caps_keys_and_adds_indexer() -> None:
    m = get_model("deepseek-v3.2")
    mla = 2 * 128 * (576 + 512)
    idx = 2 * 64 * 128
    # one query after 10,000 cached tokens: 2,048 keys attended, 10,001 scored by the indexer
    assert m.attention_flops_layer(10_000, 1) == 2048 * mla + 10_001 * idx
    # short context: no cap
    assert m.attention_flops_layer(100, 2) == (101 + 102) * (mla + idx)
    # the cap binds part way through the new tokens: keys 2047, 2048, 2048
    assert m.attention_flops_layer(2046, 3) == (2047 + 2048 + 2048) * mla + (2047 + 2048 + 2049) * idx
    assert get_model("deepseek-v3").attention_flops_layer(10_000, 1) == 10_001 * mla


def test_sliding_window_layers() -> None:
    m = get_model("gpt-oss-120b")
    assert m.num_window_layers == 18
    assert m.layer_window(0) == 128 and m.layer_window(1) is None
    assert m.kv_bytes(1000) == 1024 * (18 * 1000 + 18 * 128)
    assert m.attention_flops_layer(1000, 1, layer=0) == 128 * 4 * 64 * 64
    scout = get_model("llama-4-scout")
    assert scout.num_window_layers == 36 and scout.layer_window(3) is None


def test_weight_bytes() -> None:
    assert get_model("deepseek-v3.2").weight_bytes == 671e9
    assert get_model("qwen2.5-32b").weight_bytes == 65e9


def test_unknown_model_lists_choices() -> None:
    with pytest.raises(UnknownNameError) as err:
        get_model("gpt-5")
    assert "gpt-5" in str(err.value) and "deepseek-v3.2" in str(err.value)


def test_inconsistent_values_rejected() -> None:
    base = get_model("qwen2.5-32b")
    with pytest.raises(ConfigError, match="num_kv_heads=7"):
        dataclasses.replace(base, num_kv_heads=7)
    with pytest.raises(ConfigError, match="attention_kind='xyz'"):
        dataclasses.replace(base, attention_kind="xyz")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="active_params"):
        dataclasses.replace(base, active_params=base.total_params + 1)
    with pytest.raises(ConfigError, match="num_active_experts"):
        dataclasses.replace(get_model("glm-4.6"), num_active_experts=161)
    with pytest.raises(ConfigError, match="cached_len=-1"):
        base.attention_flops_layer(-1, 1)


def test_causal_key_count_matches_brute_force() -> None:
    import random

    from dualpath.spec.model_spec import causal_kv_sum

    rng = random.Random(3)
    for _ in range(300):
        c, n = rng.randint(0, 5000), rng.randint(0, 600)
        cap = rng.choice([None, 1, 128, 2048])
        brute = sum(min(c + i, cap) if cap is not None else c + i for i in range(1, n + 1))
        assert causal_kv_sum(c, n, cap) == brute


def test_prefill_flops_grow_with_context() -> None:
    for m in MODELS.values():
        assert m.prefill_flops(0, 64) < m.prefill_flops(8192, 64) <= m.prefill_flops(65536, 64)
        assert m.prefill_flops(100, 0) == 0.0


@pytest.mark.parametrize(
    ("hf_id", "name"),
    [
        ("Qwen/Qwen3-32B", "qwen3-32b"),
        ("qwen/qwen3-235b-a22b-fp8", "qwen3-235b-a22b-fp8"),
        ("/models/meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b"),
        ("deepseek-ai/DeepSeek-R1", "deepseek-r1"),
        ("openai/gpt-oss-120b", "gpt-oss-120b"),
        ("nvidia/Qwen3-32B-FP4", "qwen3-32b"),
        ("RedHat/Llama-3.1-8B-Instruct-FP8-dynamic", "llama-3.1-8b"),
    ],
)
def test_hugging_face_ids_are_aliases(hf_id: str, name: str) -> None:
    assert get_model(hf_id).name == name


def test_unknown_hf_id_lists_choices() -> None:
    with pytest.raises(UnknownNameError, match="qwen3-32b"):
        get_model("acme/NoSuchModel-7B")

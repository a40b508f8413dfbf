"""Models of 2026 deployments (spec/model_table.py's conventions): each entry quotes its Hugging Face
config.json; published totals exclude the multi-token-prediction (MTP) modules and vision towers.

- MiniMaxAI/MiniMax-M2.5 (``minimax_m2``): 62 layers, hidden 3072, GQA 48 / 8 x 128 (QK norm,
  rotary on 64 of 128), 256 routed experts of 1536, 8 active, no shared expert, no dense layer,
  vocab 200064; FP8 block-scaled weights (128 x 128). 229B total, 10B active (the model card,
  embeddings excluded). MiniMax-M2 and M2.1 have the same shape.
- Qwen/Qwen3.5-397B-A17B (``qwen3_5_moe``, text model): 60 layers, hidden 4096; every 4th layer
  full attention (GQA 32 / 2 x 256, output gate), the others Gated DeltaNet linear attention
  (16 key heads x 128, 64 value heads x 128, convolution kernel 4); 512 routed experts of 1024,
  10 active, one shared expert of 1024; vocab 248320; BF16. 397B total, 17B active.
- moonshotai/Kimi-K2.5 (``kimi_k2``, text model; the DeepSeek-V3 architecture): 61 layers, hidden
  7168, MLA with 64 heads (q_lora 1536, kv_lora 512, rope 64, nope 128, v 128), 384 routed experts
  of 2048, 8 active, one shared, 1 dense layer of 18432, vocab 163840; routed experts INT4
  (W4A16, group 32, BF16 scales: 4.5 bits), the rest BF16 (its compressed-tensors config).
  moonshotai/Kimi-K2-Instruct: the same text shape with FP8 block-scaled weights. 1.04T total,
  32B active.
- zai-org/GLM-5 (``glm_moe_dsa``): 78 layers, hidden 6144, MLA with 64 heads (q_lora 2048, kv_lora
  512, rope 64, nope 192, v 256) and DeepSeek sparse attention (indexer 32 heads x 128, top 2048),
  256 routed experts of 2048, 8 active, one shared, 3 dense layers of 12288, vocab 154880; BF16
  (zai-org/GLM-5-FP8: block-scaled FP8). 744B total, 40B active.
"""

from __future__ import annotations

from dualpath.spec.model_spec import ModelSpec

_HF = "https://huggingface.co/{}/blob/main/config.json"

# the FlashMLA FP8 KV layout of a 512 + 64 latent (spec/model_table.py _DS_V3_SHAPE)
_MLA_FP8_KV = 656

_KIMI_K2: dict[str, object] = dict(
    num_layers=61,
    hidden_size=7168,
    vocab_size=163840,
    attention_kind="mla",
    num_heads=64,
    num_kv_heads=64,
    head_dim=192,
    intermediate_size=18432,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    v_head_dim=128,
    num_routed_experts=384,
    num_shared_experts=1,
    num_active_experts=8,
    moe_intermediate_size=2048,
    num_dense_layers=1,
    rope_theta=50000.0,
    kv_dtype_bytes=1,
    kv_bytes_per_token_layer_override=_MLA_FP8_KV,
    total_params=1_040_000_000_000,
    active_params=32_000_000_000,
)

RECENT_MODELS = (
    ModelSpec(
        name="minimax-m2.5",
        source=_HF.format("MiniMaxAI/MiniMax-M2.5"),
        num_layers=62,
        hidden_size=3072,
        vocab_size=200064,
        attention_kind="gqa",
        num_heads=48,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=1536,
        num_routed_experts=256,
        num_active_experts=8,
        moe_intermediate_size=1536,
        rope_theta=5_000_000.0,
        kv_dtype_bytes=1,
        weight_dtype_bytes=1,
        total_params=229_000_000_000,
        active_params=10_000_000_000,
    ),
    ModelSpec(
        name="qwen3.5-397b-a17b",
        source=_HF.format("Qwen/Qwen3.5-397B-A17B"),
        num_layers=60,
        hidden_size=4096,
        vocab_size=248320,
        attention_kind="gqa",
        num_heads=32,
        num_kv_heads=2,
        head_dim=256,
        intermediate_size=1024,
        num_routed_experts=512,
        num_shared_experts=1,
        num_active_experts=10,
        moe_intermediate_size=1024,
        full_attention_every=4,
        linear_num_key_heads=16,
        linear_num_value_heads=64,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel=4,
        attention_output_gate=True,
        rope_theta=10_000_000.0,
        kv_dtype_bytes=1,
        weight_dtype_bytes=2,
        total_params=397_000_000_000,
        active_params=17_000_000_000,
    ),
    ModelSpec(
        name="kimi-k2.5",
        source=_HF.format("moonshotai/Kimi-K2.5"),
        weight_dtype_bytes=0.58,  # INT4 experts at 4.5 bits (1.015T params), 12B BF16 others
        **_KIMI_K2,  # type: ignore[arg-type]
    ),
    ModelSpec(
        name="kimi-k2",
        source=_HF.format("moonshotai/Kimi-K2-Instruct"),
        weight_dtype_bytes=1,
        **_KIMI_K2,  # type: ignore[arg-type]
    ),
    ModelSpec(
        name="glm-5",
        source=_HF.format("zai-org/GLM-5"),
        num_layers=78,
        hidden_size=6144,
        vocab_size=154880,
        attention_kind="mla",
        num_heads=64,
        num_kv_heads=64,
        head_dim=256,
        intermediate_size=12288,
        q_lora_rank=2048,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        v_head_dim=256,
        num_routed_experts=256,
        num_shared_experts=1,
        num_active_experts=8,
        moe_intermediate_size=2048,
        num_dense_layers=3,
        sparse_top_k=2048,
        index_num_heads=32,
        index_head_dim=128,
        kv_dtype_bytes=1,
        kv_bytes_per_token_layer_override=_MLA_FP8_KV,
        weight_dtype_bytes=2,
        total_params=744_000_000_000,
        active_params=40_000_000_000,
    ),
)

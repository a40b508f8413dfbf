"""The model table. Every entry quotes its source (Hugging Face config.json or the paper).

Here the paper's models (DeepSeek-V3.2 / V3 / R1, DS 27B, Qwen2.5-32B, Qwen3-235B, gpt-oss-120b)
and DeepSeek-V4; spec/model_table_catalogue.py the other open models (Qwen3, gpt-oss-20b, Llama,
GLM-4.6, SmolLM2); spec/model_table_recent.py those of 2026 deployments. ``MODELS`` keeps this order.

Published totals exclude multi-token-prediction (MTP) heads. KV is FP8 (1 byte) unless the paper says
otherwise (Qwen2.5-32B: FP16). Weight bytes are the released checkpoint's dtype.
"""

from __future__ import annotations

from dualpath.spec.model_spec import ModelSpec
from dualpath.spec.model_table_catalogue import CATALOGUE_MODELS
from dualpath.spec.model_table_recent import RECENT_MODELS

_HF = "https://huggingface.co/{}/blob/main/config.json"

# DeepSeek-V3 family shared shapes (deepseek-ai/DeepSeek-V3 config.json): MLA with q_lora 1536,
# kv_lora 512, rope 64, nope 128, v 128; 256 routed + 1 shared expert of 2048, 8 active; 3 dense layers.
_DS_V3_SHAPE: dict[str, object] = dict(
    num_layers=61,
    hidden_size=7168,
    vocab_size=129280,
    attention_kind="mla",
    num_heads=128,
    num_kv_heads=128,
    head_dim=192,
    intermediate_size=18432,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    v_head_dim=128,
    num_routed_experts=256,
    num_shared_experts=1,
    num_active_experts=8,
    moe_intermediate_size=2048,
    num_dense_layers=3,
    rope_theta=10000.0,
    kv_dtype_bytes=1,
    weight_dtype_bytes=1,
    # FlashMLA FP8 KV layout (spec section 1): 512 FP8 latent + 4 x 4 B scales + 64 BF16 rope.
    kv_bytes_per_token_layer_override=656,
)

_ENTRIES = (
    ModelSpec(  # spec section 1; deepseek-ai/DeepSeek-V3.2-Exp config.json (index_n_heads 64,
        # index_head_dim 128, index_topk 2048). 671B main model (685B with the MTP layer), 37B active.
        name="deepseek-v3.2",
        source=_HF.format("deepseek-ai/DeepSeek-V3.2-Exp"),
        total_params=671_000_000_000,
        active_params=37_000_000_000,
        sparse_top_k=2048,
        index_num_heads=64,
        index_head_dim=128,
        **_DS_V3_SHAPE,  # type: ignore[arg-type]
    ),
    ModelSpec(  # deepseek-ai/DeepSeek-V3 config.json; dense MLA (no DSA).
        name="deepseek-v3",
        source=_HF.format("deepseek-ai/DeepSeek-V3"),
        total_params=671_000_000_000,
        active_params=37_000_000_000,
        **_DS_V3_SHAPE,  # type: ignore[arg-type]
    ),
    ModelSpec(  # the paper's DS 27B (spec section 9): scaled-down V3.2. Open values, our defaults:
        # kv_lora 512 + rope 64 (as the spec assumes), q_lora 1536, nope/v 128, vocab as V3.
        name="ds-27b",
        source="paper (spec section 9); q_lora/kv_lora/vocab assumed as DeepSeek-V3",
        num_layers=30,
        hidden_size=2560,
        vocab_size=129280,
        attention_kind="mla",
        num_heads=32,
        num_kv_heads=32,
        head_dim=192,
        intermediate_size=12288,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        v_head_dim=128,
        num_routed_experts=72,
        num_shared_experts=2,
        num_active_experts=6,
        moe_intermediate_size=1536,
        num_dense_layers=1,
        rope_theta=10000.0,
        sparse_top_k=1024,
        index_num_heads=32,
        index_head_dim=64,
        kv_dtype_bytes=1,
        weight_dtype_bytes=1,
        kv_bytes_per_token_layer_override=656,
        total_params=27_000_000_000,
        active_params=4_400_000_000,  # from our shapes (see tests)
    ),
    ModelSpec(  # Qwen/Qwen2.5-32B config.json; FP16 KV as in the paper. 32.5B params.
        name="qwen2.5-32b",
        source=_HF.format("Qwen/Qwen2.5-32B"),
        num_layers=64,
        hidden_size=5120,
        vocab_size=152064,
        attention_kind="gqa",
        num_heads=40,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=27648,
        rope_theta=1_000_000.0,
        kv_dtype_bytes=2,
        weight_dtype_bytes=2,
        total_params=32_500_000_000,
        active_params=32_500_000_000,
    ),
    ModelSpec(  # Qwen/Qwen3-235B-A22B config.json: 128 experts of 1536, 8 active, no shared expert.
        name="qwen3-235b-a22b",
        source=_HF.format("Qwen/Qwen3-235B-A22B"),
        num_layers=94,
        hidden_size=4096,
        vocab_size=151936,
        attention_kind="gqa",
        num_heads=64,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=12288,
        num_routed_experts=128,
        num_active_experts=8,
        moe_intermediate_size=1536,
        rope_theta=1_000_000.0,
        kv_dtype_bytes=1,
        weight_dtype_bytes=2,
        total_params=235_000_000_000,
        active_params=22_000_000_000,
    ),
    ModelSpec(  # openai/gpt-oss-120b config.json: alternating sliding-window (128) / full layers,
        # 128 experts of 2880, 4 active; MXFP4 experts (4.25 bit), BF16 rest. 116.8B / 5.1B active.
        name="gpt-oss-120b",
        source=_HF.format("openai/gpt-oss-120b"),
        num_layers=36,
        hidden_size=2880,
        vocab_size=201088,
        attention_kind="gqa",
        num_heads=64,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=2880,
        num_routed_experts=128,
        num_active_experts=4,
        moe_intermediate_size=2880,
        rope_theta=150000.0,
        window_len=128,
        full_attention_every=2,
        kv_dtype_bytes=1,
        weight_dtype_bytes=0.56,
        total_params=116_800_000_000,
        active_params=5_100_000_000,
    ),
    ModelSpec(  # deepseek-ai/DeepSeek-R1 config.json: the DeepSeek-V3 architecture (same shapes,
        # FP8 block-scaled weights), 671B main model + 14B MTP layer, 37B active.
        name="deepseek-r1",
        source=_HF.format("deepseek-ai/DeepSeek-R1"),
        total_params=671_000_000_000,
        active_params=37_000_000_000,
        **_DS_V3_SHAPE,  # type: ignore[arg-type]
    ),
    *CATALOGUE_MODELS,
)

# DeepSeek-V4 (attention kind "csa", see spec/compressed.py): one shared-KV head of 512 (64 rope),
# 128-token sliding window on every layer, CSA (ratio 4, indexer top-k) / HCA (ratio 128) layers,
# grouped low-rank output projection, hash-routed first 3 MoE layers (same shapes), FP4 experts.
# KV entry 576 B = 448 FP8 + 64 BF16. Totals exclude the MTP layer.
_V4_COMMON: dict[str, object] = dict(
    vocab_size=129280,
    attention_kind="csa",
    num_kv_heads=1,
    head_dim=512,
    qk_rope_head_dim=64,
    num_shared_experts=1,
    num_active_experts=6,
    window_len=128,
    index_num_heads=64,
    index_head_dim=128,
    kv_dtype_bytes=1,
    kv_bytes_per_token_layer_override=576,
    o_lora_rank=1024,
    rope_theta=10000.0,
    weight_dtype_bytes=0.55,
)
_V4 = (
    ModelSpec(  # deepseek-ai/DeepSeek-V4-Pro config.json: 61 layers, hidden 7168, 128 heads,
        # q_lora 1536, o_groups 16, 384 experts of 3072, index_topk 1024,
        # compress_ratios [128, 128, (4, 128) x 29, 4]. 1.6T total, 49B active.
        name="deepseek-v4-pro",
        source=_HF.format("deepseek-ai/DeepSeek-V4-Pro"),
        num_layers=61,
        hidden_size=7168,
        num_heads=128,
        intermediate_size=3072,
        q_lora_rank=1536,
        o_groups=16,
        num_routed_experts=384,
        moe_intermediate_size=3072,
        sparse_top_k=1024,
        compress_ratios=(128, 128) + (4, 128) * 29 + (4,),
        total_params=1_600_000_000_000,
        active_params=49_000_000_000,
        **_V4_COMMON,  # type: ignore[arg-type]
    ),
    ModelSpec(  # deepseek-ai/DeepSeek-V4-Flash config.json: 43 layers, hidden 4096, 64 heads,
        # q_lora 1024, o_groups 8, 256 experts of 2048, index_topk 512,
        # compress_ratios [0, 0, (4, 128) x 20, 4]. 284B total, 13B active.
        name="deepseek-v4-flash",
        source=_HF.format("deepseek-ai/DeepSeek-V4-Flash"),
        num_layers=43,
        hidden_size=4096,
        num_heads=64,
        intermediate_size=2048,
        q_lora_rank=1024,
        o_groups=8,
        num_routed_experts=256,
        moe_intermediate_size=2048,
        sparse_top_k=512,
        compress_ratios=(0, 0) + (4, 128) * 20 + (4,),
        total_params=284_000_000_000,
        active_params=13_000_000_000,
        **_V4_COMMON,  # type: ignore[arg-type]
    ),
)

MODELS: dict[str, ModelSpec] = {m.name: m for m in (*_ENTRIES, *_V4, *RECENT_MODELS)}

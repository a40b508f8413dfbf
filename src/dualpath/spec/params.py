"""Parameter counts derived from a ModelSpec's shapes (norms and biases ignored: < 0.1%).

Used for linear FLOPs and to cross-check the published totals recorded in the table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dualpath.spec.compressed import attention_params_layer as csa_attention_params_layer

if TYPE_CHECKING:
    from dualpath.spec.model_shape import ModelShape


def attention_params_layer(m: ModelShape, layer: int = 0) -> int:
    h, d = m.num_heads, m.hidden_size
    if m.attention_kind == "csa":
        return csa_attention_params_layer(m, layer)
    if m.is_linear_layer(layer):
        return _linear_attention_params(m)
    if m.attention_kind == "mla":
        q_dim = h * m.head_dim
        q = d * q_dim if m.q_lora_rank is None else d * m.q_lora_rank + m.q_lora_rank * q_dim
        kv_a = d * (m.kv_lora_rank + m.qk_rope_head_dim)
        qk_nope = m.head_dim - m.qk_rope_head_dim
        kv_b = m.kv_lora_rank * h * (qk_nope + m.v_head_dim)
        out = h * m.v_head_dim * d
        params = q + kv_a + kv_b + out
    else:
        q = d * h * m.head_dim * (2 if m.attention_output_gate else 1)
        params = q + 2 * d * m.num_kv_heads * m.head_dim + h * m.head_dim * d
    if m.index_num_heads:
        q_in = m.q_lora_rank if m.q_lora_rank is not None else d
        params += q_in * m.index_num_heads * m.index_head_dim + d * m.index_head_dim
        params += d * m.index_num_heads
    return params


def _linear_attention_params(m: ModelShape) -> int:
    """A Gated DeltaNet layer: Q, K, V and the output gate Z projected from the hidden state, the
    two per-value-head gates (beta, alpha), the depthwise convolution over Q, K, V, the output."""
    d = m.hidden_size
    qk = m.linear_num_key_heads * m.linear_key_head_dim
    v = m.linear_num_value_heads * m.linear_value_head_dim
    proj = d * (2 * qk + 2 * v) + d * 2 * m.linear_num_value_heads
    return proj + (2 * qk + v) * m.linear_conv_kernel + v * d


def _mlp(m: ModelShape, inner: int) -> int:
    return 3 * m.hidden_size * inner  # gated MLP: gate, up, down


def _moe_layer(m: ModelShape, num_routed: int) -> int:
    router = m.hidden_size * m.num_routed_experts
    return (num_routed + m.num_shared_experts) * _mlp(m, m.moe_intermediate_size) + router


def _embedding_params(m: ModelShape) -> int:
    return m.vocab_size * m.hidden_size * (1 if m.tie_word_embeddings else 2)


def _body_params(m: ModelShape, *, active: bool) -> int:
    dense_layers = m.num_dense_layers if m.is_moe else m.num_layers
    routed = m.num_active_experts if active else m.num_routed_experts
    attn = sum(attention_params_layer(m, i) for i in range(m.num_layers))
    body = attn + dense_layers * _mlp(m, m.intermediate_size)
    if m.is_moe:
        body += m.num_moe_layers * _moe_layer(m, routed)
    return body


def shape_total_params(m: ModelShape) -> int:
    """All parameters (embeddings and LM head included)."""
    return _body_params(m, active=False) + _embedding_params(m)


def shape_active_params(m: ModelShape) -> int:
    """Parameters touched per token, embeddings and LM head included."""
    return _body_params(m, active=True) + _embedding_params(m)


def active_non_embedding_params(m: ModelShape) -> int:
    """Per-token transformer-body parameters (no embedding, no LM head)."""
    return _body_params(m, active=True)


# ---- the planner's A/F split (cost/stages.py): every parameter is in exactly one of these ----
def attention_params(m: ModelShape) -> int:
    """Attention-side parameters, all layers: Q/K/V/O projections (low-rank Q, grouped low-rank O),
    the DSA/CSA indexer and the CSA/HCA compressor. The A stages (PA, DA) hold them."""
    return sum(attention_params_layer(m, i) for i in range(m.num_layers))


def expert_params(m: ModelShape) -> int:
    """One routed expert of one MoE layer (0 for dense models)."""
    return _mlp(m, m.moe_intermediate_size) if m.is_moe else 0


def ffn_non_expert_params(m: ModelShape) -> int:
    """F-side parameters other than routed experts: dense MLPs, shared experts, routers,
    embedding and LM head. ``attention_params + ffn_non_expert_params +
    num_moe_layers x num_routed_experts x expert_params == shape_total_params``."""
    dense_layers = m.num_dense_layers if m.is_moe else m.num_layers
    body = dense_layers * _mlp(m, m.intermediate_size)
    if m.is_moe:
        body += m.num_moe_layers * _moe_layer(m, 0)  # shared experts + router
    return body + _embedding_params(m)

"""Model traffic of EP all-to-all that crosses a GPU's compute NIC (CNIC), per iteration.

DeepSeek-style EP (DeepEP normal kernels) sends each token to the GPUs of its ``top_k`` routed
experts (dispatch, FP8 activations) and brings the outputs back (combine, BF16) in every MoE layer.
Inter-node traffic is deduplicated per node: a token crosses the CNIC once per *remote node* that
holds one of its experts, and NVLink forwards it inside that node; DeepSeek-V3's node-limited routing
caps the nodes per token at ``MAX_NODES_PER_TOKEN``. With uniform routing over ``N`` nodes a token
hits ``N x (1 - (1 - 1/N)^k)`` distinct nodes (capped), of which a fraction ``(N - 1)/N`` are remote.
Experts on the same node travel over NVLink only. The bytes are what ONE GPU sends (and, balanced, also receives) in one iteration over all layers; the
simulator puts them on the CNIC high-priority lane. Dense/DP models (``ep_size == 1``) send nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dualpath.core.errors import require

if TYPE_CHECKING:
    from dualpath.spec.models import ModelSpec

DISPATCH_DTYPE_BYTES = 1.0  # DeepEP dispatches FP8 activations (plus small scales, ignored)
COMBINE_DTYPE_BYTES = 2.0  # and combines in BF16
MAX_NODES_PER_TOKEN = 4  # DeepSeek-V3 node-limited routing (topk_group = 4)


def remote_nodes_per_token(ep_size: int, num_gpus_per_node: int, top_k: int) -> float:
    """Expected remote nodes one token's ``top_k`` experts land on, in an EP group of ``ep_size``."""
    require(ep_size >= 1, "ep_size", ep_size, "must be >= 1")
    require(num_gpus_per_node >= 1, "num_gpus_per_node", num_gpus_per_node, "must be >= 1")
    num_nodes = max(1, -(-ep_size // num_gpus_per_node))
    if num_nodes == 1:
        return 0.0
    hit = num_nodes * (1.0 - (1.0 - 1.0 / num_nodes) ** top_k)
    return min(hit, float(MAX_NODES_PER_TOKEN)) * (num_nodes - 1) / num_nodes


def model_traffic_bytes(
    model: ModelSpec, num_tokens: int, *, ep_size: int, num_gpus_per_node: int = 8
) -> float:
    """CNIC bytes one GPU sends for its ``num_tokens`` tokens in one forward (all MoE layers)."""
    require(num_tokens >= 0, "num_tokens", num_tokens, "must be >= 0")
    if not model.is_moe or ep_size <= 1 or num_tokens == 0:
        return 0.0
    per_copy = model.hidden_size * (DISPATCH_DTYPE_BYTES + COMBINE_DTYPE_BYTES)
    remote = remote_nodes_per_token(ep_size, num_gpus_per_node, model.num_active_experts)
    return num_tokens * model.num_moe_layers * remote * per_copy

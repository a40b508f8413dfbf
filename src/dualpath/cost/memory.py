"""How many requests a deployment's KV cache holds: HBM minus weights and reserves, per GPU.

Per GPU of a replica (``tp x attention_dp x pp``): weights = (attention + dense/shared/router +
embedding parameters) / tp + routed experts / (moe_tp x moe_ep), all over ``pp``, at the
precision's bytes (cost/kernels.py ``DTYPE_BYTES``; embeddings and LM head stay BF16). The KV pool
follows each backend's own rule (cost/latency_terms.py): TensorRT-LLM ``KV_FREE_FRACTION`` of
what is left after weights, ``OTHER_MEM_BYTES`` and ``NCCL_MEM_BYTES``; vLLM
``VLLM_GPU_MEMORY_UTILIZATION`` of the device less weights and those reserves; SGLang
``mem_fraction_static`` of the device less weights (its reserve covers activations and graphs). A token's
KV on one GPU: GQA ``2 x max(1, kv_heads / tp) x head_dim`` values per layer (heads split by TP),
MLA its whole latent (every TP rank keeps it), windowed layers at most their window; layers / pp.

Constants (from the aiconfigurator system files and TensorRT-LLM's defaults, not fitted):
``OTHER_MEM_BYTES = 3.5 GiB`` (the system files' ``other_mem``: activations, CUDA graphs, workspace),
``NCCL_MEM_BYTES = 392 MiB`` (their ``nccl_mem`` for 4-8 GPUs; 342 MiB for 2, 0 for 1),
``KV_FREE_FRACTION = 0.9`` (TensorRT-LLM's default ``free_gpu_memory_fraction``; vLLM's
``gpu_memory_utilization`` 0.9 plays the same role).
"""

from __future__ import annotations

from dualpath.cost.kernels import DTYPE_BYTES
from dualpath.cost.latency_terms import Parallel, Precision, sglang_mem_fraction_static
from dualpath.spec.hardware import GPUSpec
from dualpath.spec.model_spec import ModelSpec
from dualpath.spec.params import attention_params, expert_params, ffn_non_expert_params

GIB = 1 << 30
OTHER_MEM_BYTES = 3.5 * GIB
NCCL_MEM_BYTES = {1: 0.0, 2: 342 * (1 << 20)}
NCCL_MEM_DEFAULT = 392 * (1 << 20)
KV_FREE_FRACTION = 0.9
VLLM_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's CacheConfig.gpu_memory_utilization default


def weight_bytes_per_gpu(model: ModelSpec, par: Parallel, prec: Precision) -> float:
    dense_b, moe_b = DTYPE_BYTES[prec.gemm], DTYPE_BYTES[prec.moe]
    embedding = model.vocab_size * model.hidden_size * (1 if model.tie_word_embeddings else 2)
    replicated = (attention_params(model) + ffn_non_expert_params(model) - embedding) * dense_b
    replicated += embedding * 2.0
    routed = model.num_moe_layers * model.num_routed_experts * expert_params(model) * moe_b
    return (replicated / par.tp + routed / (par.moe_tp * par.moe_ep)) / par.pp


def kv_bytes_per_token_gpu(model: ModelSpec, par: Parallel, prec: Precision, context_len: float) -> float:
    """Mean KV bytes one GPU keeps per token of a ``context_len``-token request."""
    kv_b = DTYPE_BYTES[prec.kv]
    if model.attention_kind == "mla":
        per_layer = (model.kv_lora_rank + model.qk_rope_head_dim) * kv_b
    else:
        per_layer = 2 * max(1, model.num_kv_heads // par.tp) * model.head_dim * kv_b
    full = model.num_layers - model.num_window_layers
    tokens = full * context_len
    if model.window_len is not None:
        tokens += model.num_window_layers * min(context_len, model.window_len)
    state = model.num_linear_layers * model.linear_state_bytes / par.tp  # heads split by TP
    return (per_layer * tokens + state) / context_len / par.pp


def kv_pool_bytes_per_gpu(
    model: ModelSpec, par: Parallel, prec: Precision, gpu: GPUSpec, backend: str = "trtllm"
) -> float:
    """Bytes of one GPU's KV pool under ``backend``'s sizing rule (0 when weights leave none)."""
    gpus = par.tp * par.attention_dp * par.pp
    reserve = OTHER_MEM_BYTES + NCCL_MEM_BYTES.get(gpus, NCCL_MEM_DEFAULT)
    weights = weight_bytes_per_gpu(model, par, prec)
    capacity = gpu.capacity_bytes
    if backend == "vllm":
        pool = VLLM_GPU_MEMORY_UTILIZATION * capacity - weights - reserve
    elif backend == "sglang":
        pool = sglang_mem_fraction_static(capacity, par.tp * par.attention_dp, par.pp) * capacity - weights
    else:
        pool = (capacity - weights - reserve) * KV_FREE_FRACTION
    return max(pool, 0.0)


def max_requests_per_rank(
    model: ModelSpec,
    par: Parallel,
    prec: Precision,
    gpu: GPUSpec,
    context_len: float,
    backend: str = "trtllm",
) -> float:
    """Requests of ``context_len`` tokens one attention rank's KV pool holds (may be < 1: the
    weights leave too little; callers say so)."""
    pool = kv_pool_bytes_per_gpu(model, par, prec, gpu, backend)
    return pool / (kv_bytes_per_token_gpu(model, par, prec, context_len) * context_len)

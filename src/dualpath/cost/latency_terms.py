"""The parallel layout, the precisions and the fixed terms of the deployment latency model.

The fixed terms are not fitted to any end-to-end figure; each is a stated constant with its reason:

- ``ELEMENTWISE_KERNELS = 4`` per layer: input RMSNorm, post-attention RMSNorm (with the residual
  add), rope + KV-cache append, gated activation (FP8 activation quantisation is fused into the
  norm and activation kernels by all three backends, so it adds none). Each reads and writes the
  layer's BF16 activations once (``tokens x hidden x 4`` bytes) at the GEMM memory efficiency, or
  takes the fastest kernel the GEMM table measured (2.4-2.5 us on H100/H200), whichever is larger:
  the launch floor comes from the tables. ``FUSED_NORMS_TRTLLM = 2``: with TP, TensorRT-LLM fuses
  the residual add and the following RMSNorm into its all-reduce kernel, so both norms cost
  nothing beyond the all-reduce table's time.
- ``ITERATION_OVERHEAD_S = 0.16 ms``: host time per iteration that the GPU waits for. All three
  backends run decode as CUDA graphs with an overlapped scheduler (above), so scheduling, input
  preparation and output processing hide behind the previous step; what remains is the gap
  between consecutive graph launches. Measured: 150-170 us per decode step with overlapped
  scheduling and CUDA graphs at batch 256 (vLLM, PR #11133; 5-6 ms before the overlap). SGLang's
  Nsight profile shows no gap with its Triton backend and "a minor gap" with FlashInfer (lmsys
  blog 2024-12-04); TensorRT-LLM publishes none. We take the measured 0.16 ms for all three.
- ``CHUNKED_PREFILL``: whether a prompt that does not fit the iteration's remaining budget is
  split (vLLM V1: chunked prefill on by default; SGLang: ``chunked_prefill_size`` 8192 on 80 GB+
  GPUs) or waits for the next iteration (TensorRT-LLM: ``enable_chunked_prefill`` off by default,
  whole prompts only). Chunking backends fill every prefill iteration greedily to the budget, so
  prompts straddle iterations (cost/prefill_packing.py); TensorRT-LLM packs ``floor(budget /
  isl)`` whole prompts, and a TensorRT-LLM prompt longer than the budget runs whole in one
  iteration (a deployment serving it must have raised ``max_num_tokens``).
- ``MIXED_BATCHES``: whether a prefill iteration also carries the running requests' decode
  tokens. TensorRT-LLM's in-flight batching and vLLM V1's unified scheduler do; SGLang runs a
  prefill ("extend") batch apart and pauses decoding for it unless ``--enable-mixed-chunk`` is
  given (off by default, sglang server_args). With fixed lengths that synchronises the groups
  (cost/latency_agg.py ``_alternating``).
- ``MAX_NUM_TOKENS = 8192``: tokens an engine schedules in one iteration (the default token budget
  of the three backends on 80 GB+ GPUs: TensorRT-LLM ``max_num_tokens``, vLLM V1
  ``max_num_batched_tokens`` for online serving, SGLang ``chunked_prefill_size``; SGLang raises
  it to 16384 on GPUs of 160 GiB or more, ``prefill_budget_tokens``). It sets how many
  prompts are prefilled together in aggregated serving and the chunk size of longer prompts.
- ``ARRIVAL_WAIT_ITERATIONS = 1`` and ``OVERLAP_EXTRA_STEPS``: a closed-loop client re-submits
  when its last token is out; by then the engine has already scheduled its next iteration (the
  scheduler does not wait for a client round trip of about a millisecond), so the new request
  waits for that whole iteration before its prefill. All three backends overlap the CPU work of
  step n with the GPU work of step n + 1 by default: TensorRT-LLM's overlap scheduler ("introduces
  one extra decoding step", its docs, features/overlap-scheduler), SGLang's zero-overhead
  scheduler (on since v0.4, lmsys blog 2024-12-04), vLLM's async scheduling (on by default since
  v0.14). Step n + 1 is launched before step n's stop check, so a finished request still rides
  one more iteration (``OVERLAP_EXTRA_STEPS = 1``), and its successor is picked up one iteration
  later: it waits ``1 + 1 = 2`` iterations in all (cost/latency_agg.py). vLLM's async scheduler
  does not schedule that extra step for a request it knows reaches ``max_tokens`` (its running
  loop skips it: vllm/v1/core/sched/scheduler.py), so for vLLM ``OVERLAP_EXTRA_STEPS = 0``. When the engine is idle
  (nothing else in flight) those iterations cost nothing beyond the extra step itself.
- ``KV_TRANSFER_EFFICIENCY = 0.8``: disaggregated KV moves at 80 % of the link (the system files'
  ``mem_bw_empirical_scaling_factor`` plays the same role for HBM), plus the system's p2p latency.
- ``MOE_DISTRIBUTION = "power_law_1.01"``: routed experts are read from the ``moe_perf`` rows
  measured with a power-law token-to-expert distribution (the milder of the two skews the tables
  hold), not the perfectly balanced rows. Trained routers are not balanced: even DeepSeek-V3's
  auxiliary-loss-free balancing leaves hot experts (its report; the reason EPLB exists), and the
  layer waits for the busiest expert / EP rank. The tables show both sides of it: at a few tokens
  a skewed routing touches fewer distinct experts (less weight traffic, up to 20-40 % cheaper
  than "balanced", which spreads tokens perfectly), at thousands of tokens the hot rank makes it
  1.2-1.8x slower. Shapes measured only balanced fall back to the balanced rows (the source says).
- ``CUDA_GRAPH_SIZES``: decode-only iterations run as CUDA graphs captured at fixed batch sizes,
  padded up to the next captured size (the padded rows go through every GEMM, expert and
  collective; attention and the LM head see only the real requests). vLLM V1:
  ``cudagraph_capture_sizes`` default 1, 2, 4, then multiples of 8 to 256, then of 16 to 512
  (vllm/config/compilation.py); SGLang: ``cuda_graph_bs`` 1, 2, 4, 8, 12, multiples of 8 to 256,
  then of 16 to 512 (sglang server_args); TensorRT-LLM pads with ``cuda_graph_config.
  enable_padding`` (set in the agg / decode configs AIConfigurator generates, its generator's
  rule files), whose default sizes are 1, 2, 4, multiples of 8 to 128, then powers of two.
  Above the largest size a batch runs eagerly, unpadded.
- ``KV_MEMORY``: how each backend sizes its KV pool (cost/memory.py): TensorRT-LLM takes
  ``free_gpu_memory_fraction = 0.9`` of the memory left after weights and activations; vLLM
  caps its whole footprint (weights, activations, graphs, KV) at ``gpu_memory_utilization = 0.9``
  of the device; SGLang caps weights + KV at ``mem_fraction_static`` of the device, which its
  server derives from the GPU size (on 80 GB+ GPUs it reserves at least 10 GiB, more with a larger
  chunked-prefill size and CUDA-graph batch; ``sglang_mem_fraction_static`` below restates that
  rule from sglang's server_args documentation).
- Attention DP: the ranks meet at every MoE gather / scatter, so an iteration lasts as long as
  the busiest rank's: with ``concurrency`` clients over ``attention_dp`` ranks the busiest holds
  ``ceil(concurrency / attention_dp)`` (cost/latency_agg.py; the decode ranks of disaggregated
  serving likewise, cost/latency.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dualpath.core.errors import ConfigError, require
from dualpath.spec.model_spec import ModelSpec

ELEMENTWISE_KERNELS = 4
FUSED_NORMS_TRTLLM = 2
MAX_NUM_TOKENS = 8192
ARRIVAL_WAIT_ITERATIONS = 1
CHUNKED_PREFILL = {"trtllm": False, "vllm": True, "sglang": True}
MIXED_BATCHES = {"trtllm": True, "vllm": True, "sglang": False}
OVERLAP_EXTRA_STEPS = {"trtllm": 1, "vllm": 0, "sglang": 1}
ITERATION_OVERHEAD_S = {"trtllm": 1.6e-4, "vllm": 1.6e-4, "sglang": 1.6e-4}
KV_TRANSFER_EFFICIENCY = 0.8
BACKENDS = tuple(ITERATION_OVERHEAD_S)
MOE_DISTRIBUTION = "power_law_1.01"


def _sizes(*parts: range | tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted({n for part in parts for n in part}))


CUDA_GRAPH_SIZES: dict[str, tuple[int, ...]] = {
    "vllm": _sizes((1, 2, 4), range(8, 257, 8), range(272, 513, 16)),
    "sglang": _sizes((1, 2, 4, 8, 12), range(16, 257, 8), range(272, 513, 16)),
    "trtllm": _sizes((1, 2, 4), range(8, 129, 8), (256, 512, 1024, 2048)),
}


def padded_decode_batch(backend: str, requests: float) -> float:
    """The batch a decode-only iteration of ``requests`` actually computes on ``backend``: the
    next captured CUDA-graph size, else (above the largest) the requests themselves."""
    sizes = CUDA_GRAPH_SIZES.get(backend, ())
    if not sizes or requests <= 0 or requests > sizes[-1]:
        return requests
    need = math.ceil(requests - 1e-9)
    return float(next(n for n in sizes if n >= need))


def prefill_budget_tokens(backend: str, capacity_bytes: float) -> int:
    """Tokens one iteration may carry: ``MAX_NUM_TOKENS``, except SGLang's ``chunked_prefill_size``
    of 16384 on GPUs of 160 GiB or more (its server_args tiers it by memory; 8192 below)."""
    if backend == "sglang" and capacity_bytes >= 160 * (1 << 30):
        return 2 * MAX_NUM_TOKENS
    return MAX_NUM_TOKENS


def sglang_mem_fraction_static(capacity_bytes: float, tp: int = 1, pp: int = 1) -> float:
    """SGLang's default ``mem_fraction_static`` for a GPU of ``capacity_bytes`` (its server
    reserves 512 MB + 1.5 MB per chunked-prefill token + tp x pp / 8 GiB + 2 MB per CUDA-graph
    batch slot, at least 10 GiB above 60 GB; chunked prefill 8192 and graph batch 256 (tp < 4) or
    512 below 160 GB, 16384 and 512 above)."""
    mib = capacity_bytes / (1 << 20)
    if mib < 60 * 1024:
        return 0.88  # sglang's fallback for the small GPUs this model does not size
    chunk, graph_bs = (8192, 256 if tp < 4 else 512) if mib < 160 * 1024 else (16384, 512)
    reserved = 512 + 1.5 * chunk + tp * pp / 8 * 1024 + 2 * graph_bs
    reserved = max(reserved, 10 * 1024)
    return (mib - reserved) / mib


# precision names (CLI and AIConfigurator's quant-mode columns) -> kernel-table dtype
_GEMM = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "bfloat16",
    "float16": "bfloat16",
    "fp8": "fp8",
    "fp8_static": "fp8",
    "fp8_block": "fp8_block",
    "nvfp4": "nvfp4",
    "fp4": "nvfp4",
    # AIConfigurator's other GEMM quant modes, at the nearest kernel-table dtype by weight bytes and
    # compute precision (roofline where the table lacks them): weight-only int8 reads 1 B and
    # computes BF16 like W8A16; SmoothQuant W8A8 and "out of the box" FP8 run 8-bit GEMMs; NVFP4
    # weight-only reads 4-bit weights
    "int8_wo": "int8_wo",
    "sq": "fp8",
    "fp8_ootb": "fp8",
    "nvfp4_wo": "w4a16_nvfp4",
    "w4a16_nvfp4": "w4a16_nvfp4",
}
_MOE = {
    **_GEMM,
    "w4a16_mxfp4_cutlass": "w4a16_mxfp4",
    "w4a8_mxfp4_mxfp8": "w4afp8",
    "w4a8_mxfp4_mxfp8_trtllm": "w4afp8",
    "w4a16_mxfp4": "w4a16_mxfp4",
    "mxfp4": "w4a16_mxfp4",
    "int4_wo": "int4_wo",
    "w4afp8": "w4afp8",
}
_KV = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "bfloat16",
    "float16": "bfloat16",
    "fp8": "fp8",
    "fp8_block": "fp8",
    "nvfp4": "fp8",
    "fp4": "fp8",
    "int8_wo": "bfloat16",
    "int8": "fp8",  # 1-byte KV
    "sq": "fp8",
    "fp8_ootb": "fp8",
    "nvfp4_wo": "bfloat16",
    "w4a16_nvfp4": "bfloat16",
}


def overlap_extra_steps(backend: str) -> int:
    """Iterations a finished request still rides under ``backend``'s overlapped scheduler."""
    return OVERLAP_EXTRA_STEPS.get(backend, 0)


def iteration_overhead_s(backend: str) -> float:
    require(backend in ITERATION_OVERHEAD_S, "backend", backend, f"choices: {', '.join(BACKENDS)}")
    return ITERATION_OVERHEAD_S[backend]


@dataclass(frozen=True, slots=True, kw_only=True)
class Parallel:
    """GPUs of one replica: ``tp x attention_dp x pp``; experts over ``moe_tp x moe_ep``."""

    tp: int = 1
    pp: int = 1
    attention_dp: int = 1
    moe_tp: int = 1
    moe_ep: int = 1

    def __post_init__(self) -> None:
        for key in ("tp", "pp", "attention_dp", "moe_tp", "moe_ep"):
            require(getattr(self, key) >= 1, key, getattr(self, key), "must be >= 1")

    @property
    def num_gpus(self) -> int:
        return self.tp * self.attention_dp * self.pp

    def check(self, model: ModelSpec) -> None:
        """ConfigError when the layout does not fit ``model``'s heads and experts."""
        require(
            model.num_heads % self.tp == 0,
            "tp",
            self.tp,
            f"must divide {model.name}'s {model.num_heads} attention heads",
        )
        require(
            model.num_layers >= self.pp, "pp", self.pp, f"exceeds {model.name}'s {model.num_layers} layers"
        )
        if model.is_moe:
            require(
                self.moe_tp * self.moe_ep == self.tp * self.attention_dp,
                "moe_tp x moe_ep",
                (self.moe_tp, self.moe_ep),
                f"must equal tp x attention_dp = {self.tp * self.attention_dp}",
            )
            require(
                model.num_routed_experts % self.moe_ep == 0,
                "moe_ep",
                self.moe_ep,
                f"must divide {model.name}'s {model.num_routed_experts} experts",
            )
        elif self.moe_tp * self.moe_ep not in (1, self.tp, self.tp * self.attention_dp):
            raise ConfigError(
                "moe_tp x moe_ep", (self.moe_tp, self.moe_ep), f"{model.name} is dense: leave them 1"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Precision:
    """Kernel-table dtypes of the dense GEMMs, the routed experts and the KV cache."""

    gemm: str
    moe: str
    kv: str

    @classmethod
    def resolve(
        cls,
        model: ModelSpec,
        precision: str | None = None,
        *,
        gemm: str | None = None,
        moe: str | None = None,
        kv: str | None = None,
    ) -> Precision:
        """From a precision name and/or per-part quant modes; unset parts follow the checkpoint:
        FP8 checkpoints (1 B/param: DeepSeek, Qwen3-FP8) run block-scaled FP8, MXFP4 experts
        (gpt-oss) W4A16 with BF16 dense layers, the rest BF16. ``fp8`` on an FP8-block checkpoint
        means its block scaling."""
        block = model.weight_dtype_bytes == 1
        base = _pick(_GEMM, precision, "precision") if precision else None
        if base == "fp8" and block:
            base = "fp8_block"
        native = "fp8_block" if block else "bfloat16"
        g = _pick(_GEMM, gemm, "gemm_quant_mode") if gemm else (base or native)
        if g == "fp8" and block:
            g = "fp8_block"
        native_moe = "w4a16_mxfp4" if model.weight_dtype_bytes < 1 else native
        mo = (
            _pick(_MOE, moe, "moe_quant_mode")
            if moe
            else (native_moe if model.weight_dtype_bytes < 1 else (base or native))
        )
        if mo == "fp8" and block:
            mo = "fp8_block"
        kv_dtype = _pick(_KV, kv, "kv_dtype") if kv else ("fp8" if g != "bfloat16" else "bfloat16")
        return cls(gemm=g, moe=mo, kv=kv_dtype)


def _pick(table: dict[str, str], name: str, key: str) -> str:
    value = table.get(name.strip().lower())
    if value is None:
        raise ConfigError(key, name, f"choices: {', '.join(sorted(table))}")
    return value

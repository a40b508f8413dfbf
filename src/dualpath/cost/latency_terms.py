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
- ``ITERATION_OVERHEAD_S``: host time per iteration that the GPU waits for (scheduling, input
  preparation, sampling sync). All three backends run decode as CUDA graphs with an overlapped
  scheduler, so most host work hides behind the previous step. 0.3 ms is our estimate of the part
  that does not (one graph launch plus a device-to-host sync of the sampled tokens, each ~0.1 ms);
  it is NOT a measurement: plausible range 0.1-2 ms. Stated here so it can be measured and replaced.
- ``MAX_NUM_TOKENS = 8192``: tokens an engine schedules in one iteration (the default token budget
  of the three backends on 80 GB+ GPUs: TensorRT-LLM ``max_num_tokens``, vLLM V1
  ``max_num_batched_tokens`` for online serving, SGLang ``chunked_prefill_size``). It sets how many
  prompts are prefilled together in aggregated serving and the chunk size of longer prompts.
- ``ARRIVAL_WAIT_ITERATIONS = 1.0``: a closed-loop client re-submits when its last token is out;
  by then the engine has started the next iteration (it does not wait for a client round trip of
  about a millisecond), so the new request waits for that whole iteration before its prefill
  (none when no other request is in flight: then the engine is idle).
- ``KV_TRANSFER_EFFICIENCY = 0.8``: disaggregated KV moves at 80 % of the link (the system files'
  ``mem_bw_empirical_scaling_factor`` plays the same role for HBM), plus the system's p2p latency.
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.core.errors import ConfigError, require
from dualpath.spec.model_spec import ModelSpec

ELEMENTWISE_KERNELS = 4
FUSED_NORMS_TRTLLM = 2
MAX_NUM_TOKENS = 8192
ARRIVAL_WAIT_ITERATIONS = 1.0
ITERATION_OVERHEAD_S = {"trtllm": 3e-4, "vllm": 3e-4, "sglang": 3e-4}
KV_TRANSFER_EFFICIENCY = 0.8
BACKENDS = tuple(ITERATION_OVERHEAD_S)

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
}
_MOE = {
    **_GEMM,
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
}


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
        elif (self.moe_tp, self.moe_ep) != (1, 1) and self.moe_tp * self.moe_ep != self.tp:
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

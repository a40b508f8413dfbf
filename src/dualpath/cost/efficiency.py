"""Every roofline constant of the cost models, in one place, each with its reason.

The roofline time of one GPU operation is

    max(flops / (peak_flops x compute_eff), bytes / (hbm_bytes_per_s x memory_eff))
      + num_kernels x kernel_launch_s

Efficiencies are fractions of the data-sheet peak (``GPUSpec.dense_tflops(dtype)`` and
``hbm_bandwidth_gbs``). The values were read off the measured H100 SXM kernel tables in
``../shared/data/hardware/aiconfigurator-perf-db/h100_sxm`` (TensorRT-LLM 1.3.0rc20), so that the
roofline and the calibrated model agree where the tables are flat; see docs/cost.md.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from dualpath.core.errors import require
from dualpath.core.registry import lookup


@dataclass(frozen=True, slots=True, kw_only=True)
class Efficiency:
    """Per-operation efficiencies and fixed overheads of the roofline model."""

    # Dense GEMM, BF16 weights: the gemm table reaches 0.72-0.82 of 989 TFLOPS for
    # m >= 512 at n = k = 7168; 0.75 is the middle of that plateau.
    gemm_bf16_compute: float = 0.75
    # Dense GEMM, FP8 weights (DeepSeek block-scaled FP8): 0.55-0.60 of 1,978 TFLOPS in the
    # same table; FP8 tensor cores are harder to feed, so the fraction is lower than BF16.
    gemm_fp8_compute: float = 0.55
    # Weight-streaming (small m) GEMMs: the table shows 0.60-0.76 of 3.35 TB/s at m <= 64;
    # it is also aiconfigurator's mem_bw_empirical_scaling_factor (0.8) minus launch effects.
    gemm_memory: float = 0.70
    # Attention compute: prefill MLA reaches 0.58-0.72 of the BF16 peak for isl >= 6K
    # (context_mla table); FlashMLA/FA3 report the same range. Attention math runs in BF16.
    attention_compute: float = 0.60
    # Attention KV streaming (decode): the generation_mla table moves about 1.5 TB/s at batch 64
    # x 32K (0.45); FlashMLA reports about 0.9 on H800. 0.6 sits between the two.
    attention_memory: float = 0.60
    # Routed-expert grouped GEMMs: per-expert m is small and uneven; the moe table reaches
    # 0.25-0.35 of the FP8 peak at 8-16K group tokens (EP 8-16).
    moe_compute: float = 0.35
    # Expert weight streaming at small batch: the moe table at EP16 and few tokens reads the
    # local experts at roughly 0.5-0.6 of HBM bandwidth.
    moe_memory: float = 0.55
    # Fixed cost per kernel: aiconfigurator's mem_empirical_constant_latency (3 us) on H100.
    kernel_launch_s: float = 3e-6
    # Kernels per layer (fused, CUDA-graph style): attention = indexer/score + attention +
    # KV append + output; dense = norm, QKV/down projections, shared expert, router;
    # MoE = permute, two grouped GEMMs, combine.
    attention_kernels: int = 4
    dense_kernels: int = 6
    moe_kernels: int = 4

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_kernels"):
                require(value >= 0, f.name, value, "must be >= 0")
            elif f.name == "kernel_launch_s":
                require(0 <= value < 1e-3, f.name, value, "must be in [0, 1 ms)")
            else:
                require(0 < value <= 1, f.name, value, "efficiency must be in (0, 1]")

    def gemm_compute(self, weight_dtype_bytes: int) -> float:
        """Compute efficiency of a dense GEMM with weights of ``weight_dtype_bytes`` bytes."""
        return self.gemm_fp8_compute if weight_dtype_bytes <= 1 else self.gemm_bf16_compute


DEFAULT_EFFICIENCY = Efficiency()
# The paper's Eq. 1 (heteropanacea.md): every peak reached, no kernel-launch term. The planner's
# default for both catalogues, so that NPUs and GPUs are compared on the same terms.
IDEAL_EFFICIENCY = Efficiency(
    gemm_bf16_compute=1.0,
    gemm_fp8_compute=1.0,
    gemm_memory=1.0,
    attention_compute=1.0,
    attention_memory=1.0,
    moe_compute=1.0,
    moe_memory=1.0,
    kernel_launch_s=0.0,
    attention_kernels=0,
    dense_kernels=0,
    moe_kernels=0,
)
EFFICIENCY_PRESETS: dict[str, Efficiency] = {"ideal": IDEAL_EFFICIENCY, "fitted": DEFAULT_EFFICIENCY}


def get_efficiency(name: str) -> Efficiency:
    """``"ideal"`` (all 1.0, no launch term) or ``"fitted"`` (the H100-fitted values above)."""
    return lookup(EFFICIENCY_PRESETS, name, "efficiency")


def roofline_s(
    flops: float,
    num_bytes: float,
    peak_flops: float,
    bytes_per_s: float,
    compute_eff: float,
    memory_eff: float,
    num_kernels: int,
    kernel_launch_s: float,
) -> float:
    """Time of one operation: the slower of its compute and memory sides, plus launches."""
    compute_s = flops / (peak_flops * compute_eff) if flops > 0 else 0.0
    memory_s = num_bytes / (bytes_per_s * memory_eff) if num_bytes > 0 else 0.0
    return max(compute_s, memory_s) + num_kernels * kernel_launch_s

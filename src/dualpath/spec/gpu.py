"""GPUSpec: one GPU's dense tensor-core rates by dtype, HBM, power and links (spec/hardware.py's
module doc has the sources; the table is spec/gpu_table.py)."""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.core.errors import ConfigError, require
from dualpath.spec.device import check_bits

DTYPES = ("fp4", "fp8", "int8", "bf16", "fp16")
_WIDER = {"fp4": "fp8", "fp8": "bf16", "int8": "bf16", "fp16": "bf16"}


@dataclass(frozen=True, slots=True, kw_only=True)
class GPUSpec:
    """One GPU. TFLOPS are dense (no sparsity); ``None`` = dtype not supported by the tensor cores."""

    name: str
    year: int
    bf16_tflops: float
    fp8_tflops: float | None
    fp4_tflops: float | None
    int8_tflops: float
    hbm_gb: float  # decimal GB
    hbm_bandwidth_gbs: float  # GB/s
    tdp_w: float
    nic_gbps: float  # compute NIC per GPU in the vendor's DGX node
    pcie_gbs: float  # one direction
    nvlink_gbs: float  # one direction, per GPU; 0 = PCIe only
    memory: str = "hbm"  # memory family (spec.device.MEMORY_FAMILIES), for the power model

    def __post_init__(self) -> None:
        for key in (
            "bf16_tflops",
            "int8_tflops",
            "hbm_gb",
            "hbm_bandwidth_gbs",
            "tdp_w",
            "nic_gbps",
            "pcie_gbs",
        ):
            require(getattr(self, key) > 0, key, getattr(self, key), "must be positive")
        require(self.nvlink_gbs >= 0, "nvlink_gbs", self.nvlink_gbs, "must be >= 0")

    # ---- spec.device.Device ----------------------------------------------------------------
    def peak_flops(self, bits: int) -> float:
        """Dense FLOP/s for ``bits``-bit operands (4: FP4, 8: FP8, 16: BF16), falling back to
        the next wider dtype the tensor cores support (FP8 on A100 runs at the BF16 rate)."""
        if bits == 16:  # hot path of the planner: no table walk, no message strings
            return self.bf16_tflops * 1e12
        if bits == 8:
            return (self.fp8_tflops or self.bf16_tflops) * 1e12
        check_bits(bits)
        return (self.fp4_tflops or self.fp8_tflops or self.bf16_tflops) * 1e12

    @property
    def mem_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_gbs * 1e9

    @property
    def capacity_bytes(self) -> float:
        return self.hbm_gb * 1e9

    def dense_tflops(self, dtype: str) -> float:
        """Dense tensor-core TFLOPS for ``dtype``; error if unknown or unsupported on this GPU."""
        require(dtype in DTYPES, "dtype", dtype, f"choices: {', '.join(DTYPES)}")
        value = self._raw(dtype)
        if value is None:
            supported = [d for d in DTYPES if d == "fp16" or self._raw(d) is not None]
            raise ConfigError(
                "dtype", dtype, f"not supported by {self.name}; choices: {', '.join(supported)}"
            )
        return value

    def compute_tflops(self, dtype: str) -> float:
        """Like :meth:`dense_tflops`, but an unsupported dtype runs at the next wider one
        (fp4 -> fp8 -> bf16), as a kernel would on that GPU (e.g. FP8 models on A100 run in BF16)."""
        require(dtype in DTYPES, "dtype", dtype, f"choices: {', '.join(DTYPES)}")
        while self._raw(dtype) is None:
            dtype = _WIDER[dtype]
        return self.dense_tflops(dtype)

    def best_dense_tflops(self) -> tuple[str, float]:
        """The narrowest floating-point dtype the tensor cores support, and its TFLOPS."""
        for dtype in ("fp4", "fp8", "bf16"):
            if (value := self._raw(dtype)) is not None:
                return dtype, value
        raise AssertionError("bf16 is always present")

    def _raw(self, dtype: str) -> float | None:
        return {
            "fp4": self.fp4_tflops,
            "fp8": self.fp8_tflops,
            "int8": self.int8_tflops,
            "bf16": self.bf16_tflops,
            "fp16": self.bf16_tflops,
        }[dtype]

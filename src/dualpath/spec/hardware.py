"""GPU and node tables.

GPU compute, HBM and power come from ai-dynamo/aiconfigurator system files
(``shared/data/hardware/aiconfigurator-systems/*_sxm.yaml``, dense tensor-core FLOPS); the per-GPU NIC
and PCIe figures from the NVIDIA DGX datasheets (DGX A100: ConnectX-6 200 Gb/s per GPU, PCIe 4;
DGX H100/H200/B200: ConnectX-7 400 Gb/s per GPU, PCIe 5). Node DRAM bandwidths of the DGX nodes are
our estimates from their CPUs' memory channels; the paper's node (``hopper-8x400``) uses its M=500 GB/s.

The GPUs of the planner's GPU catalogue (A100 40 GB, L40S, L4, A10G, T4, V100, M60) quote NVIDIA's
product datasheets (dense tensor-core TFLOPS, i.e. half the "with sparsity" figure); their NIC is
the per-GPU share of the 8-GPU AWS instance that carries them. T4 and V100 have no BF16 tensor
cores: their FP16 tensor rate stands in for ``bf16_tflops``. Every GPU implements
``spec.device.Device`` (``peak_flops(bits)``, ``mem_bytes_per_s``, ``capacity_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.core.errors import ConfigError, require
from dualpath.core.registry import lookup
from dualpath.core.units import gbps_to_bytes_per_s
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


GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        # a100_sxm.yaml: 312 TF bf16, 624 int8, 80 GiB, 2.039 TB/s, 400 W. No FP8/FP4.
        GPUSpec(
            name="a100",
            year=2020,
            bf16_tflops=312.0,
            fp8_tflops=None,
            fp4_tflops=None,
            int8_tflops=624.0,
            hbm_gb=85.899,
            hbm_bandwidth_gbs=2039.0,
            tdp_w=400.0,
            nic_gbps=200.0,
            pcie_gbs=32.0,
            nvlink_gbs=300.0,
        ),
        # h100_sxm.yaml: 989 TF bf16, 1978 fp8, 80 GiB, 3.35 TB/s, 700 W.
        GPUSpec(
            name="h100",
            year=2022,
            bf16_tflops=989.0,
            fp8_tflops=1978.0,
            fp4_tflops=None,
            int8_tflops=1978.0,
            hbm_gb=85.899,
            hbm_bandwidth_gbs=3350.0,
            tdp_w=700.0,
            nic_gbps=400.0,
            pcie_gbs=64.0,
            nvlink_gbs=450.0,
        ),
        # h200_sxm.yaml: as H100 with 141 GiB at 4.8 TB/s.
        GPUSpec(
            name="h200",
            year=2024,
            bf16_tflops=989.0,
            fp8_tflops=1978.0,
            fp4_tflops=None,
            int8_tflops=1978.0,
            hbm_gb=151.398,
            hbm_bandwidth_gbs=4800.0,
            tdp_w=700.0,
            nic_gbps=400.0,
            pcie_gbs=64.0,
            nvlink_gbs=450.0,
        ),
        # b200_sxm.yaml: 2250 TF bf16, 4500 fp8, 9000 fp4, 180 GiB, 7.7 TB/s, 1000 W.
        GPUSpec(
            name="b200",
            year=2024,
            bf16_tflops=2250.0,
            fp8_tflops=4500.0,
            fp4_tflops=9000.0,
            int8_tflops=4500.0,
            hbm_gb=193.274,
            hbm_bandwidth_gbs=7700.0,
            tdp_w=1000.0,
            nic_gbps=400.0,
            pcie_gbs=64.0,
            nvlink_gbs=900.0,
        ),
        # NVIDIA A100 datasheet (SXM4 40 GB): 312 TF bf16, 624 int8, 40 GB HBM2 at 1,555 GB/s,
        # 400 W; AWS p4d.24xlarge: 8 GPUs, 400 Gb/s EFA (50 per GPU).
        GPUSpec(
            name="a100-40gb",
            year=2020,
            bf16_tflops=312.0,
            fp8_tflops=None,
            fp4_tflops=None,
            int8_tflops=624.0,
            hbm_gb=42.950,
            hbm_bandwidth_gbs=1555.0,
            tdp_w=400.0,
            nic_gbps=50.0,
            pcie_gbs=32.0,
            nvlink_gbs=300.0,
        ),
        # NVIDIA L40S datasheet: 362.05 TF bf16 dense (733 sparse), 733 fp8/int8 dense, 48 GB
        # GDDR6 at 864 GB/s, 350 W, PCIe 4 x16; AWS g6e.48xlarge: 8 GPUs, 400 Gb/s.
        GPUSpec(
            name="l40s",
            year=2023,
            bf16_tflops=362.05,
            fp8_tflops=733.0,
            fp4_tflops=None,
            int8_tflops=733.0,
            hbm_gb=51.540,
            hbm_bandwidth_gbs=864.0,
            tdp_w=350.0,
            nic_gbps=50.0,
            pcie_gbs=32.0,
            nvlink_gbs=0.0,
            memory="gddr",
        ),
        # NVIDIA L4 datasheet: 121 TF bf16 dense (242 sparse), 242.5 fp8/int8 dense, 24 GB GDDR6 at
        # 300 GB/s, 72 W, PCIe 4 x16; AWS g6.48xlarge: 8 GPUs, 100 Gb/s.
        GPUSpec(
            name="l4",
            year=2023,
            bf16_tflops=121.0,
            fp8_tflops=242.5,
            fp4_tflops=None,
            int8_tflops=242.5,
            hbm_gb=25.770,
            hbm_bandwidth_gbs=300.0,
            tdp_w=72.0,
            nic_gbps=12.5,
            pcie_gbs=32.0,
            nvlink_gbs=0.0,
            memory="gddr",
        ),
        # AWS A10G (G5 instances; NVIDIA A10 variant with fewer tensor FLOPS): about 70 TF
        # fp16/bf16 dense tensor (A10: 125), 140 int8, 24 GB GDDR6 at 600 GB/s, 300 W board power
        # (as AWS's G5 documentation and Baseten's A10 vs A10G comparison give them);
        # g5.48xlarge: 8 GPUs, 100 Gb/s.
        GPUSpec(
            name="a10g",
            year=2021,
            bf16_tflops=70.0,
            fp8_tflops=None,
            fp4_tflops=None,
            int8_tflops=140.0,
            hbm_gb=25.770,
            hbm_bandwidth_gbs=600.0,
            tdp_w=300.0,
            nic_gbps=12.5,
            pcie_gbs=32.0,
            nvlink_gbs=0.0,
            memory="gddr",
        ),
        # NVIDIA T4 datasheet: 65 TF fp16 tensor (no bf16), 130 int8, 16 GB GDDR6 at 320 GB/s,
        # 70 W, PCIe 3 x16; AWS g4dn.metal: 8 GPUs, 100 Gb/s.
        GPUSpec(
            name="t4",
            year=2018,
            bf16_tflops=65.0,
            fp8_tflops=None,
            fp4_tflops=None,
            int8_tflops=130.0,
            hbm_gb=17.180,
            hbm_bandwidth_gbs=320.0,
            tdp_w=70.0,
            nic_gbps=12.5,
            pcie_gbs=16.0,
            nvlink_gbs=0.0,
            memory="gddr",
        ),
        # NVIDIA V100 datasheet (SXM2 16 GB): 125 TF fp16 tensor (no bf16), 62.8 int8 (DP4A, no
        # int8 tensor cores), 16 GB HBM2 at 900 GB/s, 300 W, NVLink 2 300 GB/s (150 per
        # direction); AWS p3.16xlarge: 8 GPUs, 25 Gb/s.
        GPUSpec(
            name="v100",
            year=2017,
            bf16_tflops=125.0,
            fp8_tflops=None,
            fp4_tflops=None,
            int8_tflops=62.8,
            hbm_gb=17.180,
            hbm_bandwidth_gbs=900.0,
            tdp_w=300.0,
            nic_gbps=3.125,
            pcie_gbs=16.0,
            nvlink_gbs=150.0,
        ),
        # NVIDIA Tesla M60 datasheet (one of the board's two GPUs): no tensor cores, 4.8 TF FP32
        # (FP16 and INT8 no faster; the FP32 rate stands in for every dtype), 8 GB GDDR5 at
        # 160 GB/s, 150 W (300 W per two-GPU board); AWS g3.16xlarge: 4 GPUs, 25 Gb/s.
        GPUSpec(
            name="m60",
            year=2015,
            bf16_tflops=4.8,
            fp8_tflops=None,
            fp4_tflops=None,
            int8_tflops=4.8,
            hbm_gb=8.590,
            hbm_bandwidth_gbs=160.0,
            tdp_w=150.0,
            nic_gbps=6.25,
            pcie_gbs=16.0,
            nvlink_gbs=0.0,
            memory="gddr",
        ),
    )
}


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """One server: ``num_gpus`` (g) GPUs, one compute NIC per GPU (B = ``cnic_gbps``),
    ``num_snics`` (s) storage NICs of ``snic_gbps`` each, DRAM bandwidth M and a KV DRAM buffer."""

    name: str
    gpu: str  # key of GPUS
    num_gpus: int
    cnic_gbps: float
    num_snics: int
    snic_gbps: float
    dram_bandwidth_gbs: float
    dram_buffer_gb: float

    def __post_init__(self) -> None:
        lookup(GPUS, self.gpu, "gpu")
        require(self.num_gpus > 0, "num_gpus", self.num_gpus, "must be positive")
        require(self.num_snics > 0, "num_snics", self.num_snics, "must be positive")
        for key in ("cnic_gbps", "snic_gbps", "dram_bandwidth_gbs"):
            require(getattr(self, key) > 0, key, getattr(self, key), "must be positive")
        require(self.dram_buffer_gb >= 0, "dram_buffer_gb", self.dram_buffer_gb, "must be >= 0")

    @property
    def gpu_spec(self) -> GPUSpec:
        return GPUS[self.gpu]

    @property
    def snic_bytes_per_s(self) -> float:
        """Storage bandwidth of the whole node (all SNICs)."""
        return self.num_snics * gbps_to_bytes_per_s(self.snic_gbps)

    @property
    def cnic_bytes_per_s(self) -> float:
        """Compute-network bandwidth of one GPU's NIC, one direction."""
        return gbps_to_bytes_per_s(self.cnic_gbps)

    @property
    def dram_bytes_per_s(self) -> float:
        return self.dram_bandwidth_gbs * 1e9


NODES: dict[str, NodeSpec] = {
    n.name: n
    for n in (
        # The paper's node (spec sections 6 and 9): 8 Hopper GPUs, 8 x 400 Gbps CNIC, 1 x 400 Gbps
        # SNIC to 3FS, M = 500 GB/s, 80 GB KV buffer (the DeepSeek setting). Compute as H100 SXM.
        NodeSpec(
            name="hopper-8x400",
            gpu="h100",
            num_gpus=8,
            cnic_gbps=400.0,
            num_snics=1,
            snic_gbps=400.0,
            dram_bandwidth_gbs=500.0,
            dram_buffer_gb=80.0,
        ),
        # DGX-like nodes, one per GPU. DRAM: 2 sockets x 8 channels (DDR4-3200 / DDR5-4800 / 5600).
        NodeSpec(
            name="dgx-a100",
            gpu="a100",
            num_gpus=8,
            cnic_gbps=200.0,
            num_snics=1,
            snic_gbps=200.0,
            dram_bandwidth_gbs=409.6,
            dram_buffer_gb=80.0,
        ),
        NodeSpec(
            name="dgx-h100",
            gpu="h100",
            num_gpus=8,
            cnic_gbps=400.0,
            num_snics=1,
            snic_gbps=400.0,
            dram_bandwidth_gbs=614.4,
            dram_buffer_gb=80.0,
        ),
        NodeSpec(
            name="dgx-h200",
            gpu="h200",
            num_gpus=8,
            cnic_gbps=400.0,
            num_snics=1,
            snic_gbps=400.0,
            dram_bandwidth_gbs=614.4,
            dram_buffer_gb=80.0,
        ),
        NodeSpec(
            name="dgx-b200",
            gpu="b200",
            num_gpus=8,
            cnic_gbps=400.0,
            num_snics=1,
            snic_gbps=400.0,
            dram_bandwidth_gbs=716.8,
            dram_buffer_gb=80.0,
        ),
    )
}


def get_gpu(name: str) -> GPUSpec:
    return lookup(GPUS, name, "gpu")


def get_node(name: str) -> NodeSpec:
    return lookup(NODES, name, "node")

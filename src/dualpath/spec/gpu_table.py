"""The GPU table (sources: spec/hardware.py's module doc)."""

from __future__ import annotations

from dualpath.core.registry import lookup
from dualpath.spec.gpu import GPUSpec

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


def get_gpu(name: str) -> GPUSpec:
    return lookup(GPUS, name, "gpu")

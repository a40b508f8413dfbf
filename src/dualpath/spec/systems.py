"""Deployment systems (AIConfigurator's system names): the GPU and its node's interconnect.

Numbers quote ai-dynamo/aiconfigurator's system files
(``shared/data/hardware/aiconfigurator-systems/<system>.yaml``): NVLink (``intra_node_bw``) and the
per-GPU network (``inter_node_bw``) one direction, GPUs per NVLink domain, and the measured-ish
``p2p_latency`` those files give. The GPU itself is ``spec.hardware.GPUS`` (h100, h200, b200);
GB200 has no entry there, so its GPU is defined here from gb200.yaml (2.5 PF BF16, 5 PF FP8,
10 PF FP4, 8 TB/s, 185 GiB, 1200 W). B300 has no system file, so there is no b300 system.
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.core.errors import require
from dualpath.core.registry import lookup
from dualpath.spec.hardware import GPUS, GPUSpec

# gb200.yaml: NVLink 5 at 900 GB/s; CX8 800 Gb/s per GPU between racks.
GB200_GPU = GPUSpec(
    name="gb200",
    year=2024,
    bf16_tflops=2500.0,
    fp8_tflops=5000.0,
    fp4_tflops=10000.0,
    int8_tflops=5000.0,
    hbm_gb=198.675,
    hbm_bandwidth_gbs=8000.0,
    tdp_w=1200.0,
    nic_gbps=800.0,
    pcie_gbs=64.0,
    nvlink_gbs=900.0,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SystemSpec:
    """One deployment system: ``gpu`` and the links between its GPUs."""

    name: str
    gpu: GPUSpec
    nvlink_domain_gpus: int  # GPUs that reach each other over NVLink (node; GB200: the rack)
    intra_node_gbs: float  # NVLink, GB/s per GPU one direction
    inter_node_gbs: float  # network, GB/s per GPU one direction
    p2p_latency_s: float  # one point-to-point transfer's fixed latency
    perf_db: str  # folder of its kernel tables under hardware/aiconfigurator-perf-db/

    def __post_init__(self) -> None:
        for key in ("nvlink_domain_gpus", "intra_node_gbs", "inter_node_gbs"):
            require(getattr(self, key) > 0, key, getattr(self, key), "must be positive")
        require(self.p2p_latency_s >= 0, "p2p_latency_s", self.p2p_latency_s, "must be >= 0")

    def link_bytes_per_s(self, num_gpus: int) -> float:
        """Per-GPU bandwidth of a group of ``num_gpus``: NVLink inside the domain, else network."""
        gbs = self.intra_node_gbs if num_gpus <= self.nvlink_domain_gpus else self.inter_node_gbs
        return gbs * 1e9


SYSTEMS: dict[str, SystemSpec] = {
    s.name: s
    for s in (
        # h100_sxm.yaml / h200_sxm.yaml: NVLink 450 GB/s, CX7 400 Gb/s (50 GB/s) per GPU, 10 us.
        SystemSpec(
            name="h100_sxm",
            gpu=GPUS["h100"],
            nvlink_domain_gpus=8,
            intra_node_gbs=450.0,
            inter_node_gbs=50.0,
            p2p_latency_s=1e-5,
            perf_db="h100_sxm",
        ),
        SystemSpec(
            name="h200_sxm",
            gpu=GPUS["h200"],
            nvlink_domain_gpus=8,
            intra_node_gbs=450.0,
            inter_node_gbs=50.0,
            p2p_latency_s=1e-5,
            perf_db="h200_sxm",
        ),
        # b200_sxm.yaml: NVLink 900 GB/s, CX8 800 Gb/s (100 GB/s) per GPU, 10 us.
        SystemSpec(
            name="b200_sxm",
            gpu=GPUS["b200"],
            nvlink_domain_gpus=8,
            intra_node_gbs=900.0,
            inter_node_gbs=100.0,
            p2p_latency_s=1e-5,
            perf_db="b200_sxm",
        ),
        # gb200.yaml: NVLink within the 72-GPU rack at 900 GB/s, 100 GB/s between racks.
        SystemSpec(
            name="gb200",
            gpu=GB200_GPU,
            nvlink_domain_gpus=72,
            intra_node_gbs=900.0,
            inter_node_gbs=100.0,
            p2p_latency_s=1e-5,
            perf_db="gb200",
        ),
    )
}


def get_system(name: str) -> SystemSpec:
    """The system called ``name`` (``h100_sxm``, ...); the GPU names (``h100``) are accepted too."""
    aliases = {s.gpu.name: key for key, s in SYSTEMS.items()}
    return lookup(SYSTEMS, aliases.get(name.lower(), name.lower()), "system")

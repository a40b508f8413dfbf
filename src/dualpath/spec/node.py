"""NodeSpec and the node table: GPUs, compute and storage NICs, DRAM bandwidth and KV buffer
(sources: spec/hardware.py's module doc)."""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.core.errors import require
from dualpath.core.registry import lookup
from dualpath.core.units import gbps_to_bytes_per_s
from dualpath.spec.gpu import GPUSpec
from dualpath.spec.gpu_table import GPUS


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


def get_node(name: str) -> NodeSpec:
    return lookup(NODES, name, "node")

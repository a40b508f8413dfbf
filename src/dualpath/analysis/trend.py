"""I/O-to-compute trend across NVIDIA generations (spec section 1: A100 -> H100 -> B200).

Dtype basis: each generation at the narrowest floating-point dtype its tensor cores run dense (A100 BF16
312 TFLOPS, H100/H200 FP8 1,978, B200 FP4 9,000), i.e. what a model tuned for that generation uses.
That gives compute x28.8 from A100 to B200; the per-GPU NIC of the vendor's DGX node goes 200 -> 400
Gbps (x2.0), so bytes of I/O per FLOP fall 14.4x. HBM capacity and bandwidth are reported alongside.
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.core.errors import require
from dualpath.core.registry import lookup
from dualpath.core.units import TFLOP, gbps_to_bytes_per_s
from dualpath.spec.hardware import GPUS

PAPER_GENERATIONS = ("a100", "h100", "b200")


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationPoint:
    gpu: str
    year: int
    dtype: str
    dense_tflops: float
    nic_gbps: float
    hbm_gb: float
    hbm_bandwidth_gbs: float
    io_bytes_per_kflop: float  # NIC bytes/s per dense FLOP/s, x 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class Trend:
    points: tuple[GenerationPoint, ...]
    compute_x: float  # last / first
    nic_x: float
    hbm_capacity_x: float
    hbm_bandwidth_x: float
    io_to_compute_drop_x: float  # compute_x / nic_x


def _point(name: str) -> GenerationPoint:
    gpu = lookup(GPUS, name, "gpu")
    dtype, tflops = gpu.best_dense_tflops()
    return GenerationPoint(
        gpu=name,
        year=gpu.year,
        dtype=dtype,
        dense_tflops=tflops,
        nic_gbps=gpu.nic_gbps,
        hbm_gb=gpu.hbm_gb,
        hbm_bandwidth_gbs=gpu.hbm_bandwidth_gbs,
        io_bytes_per_kflop=gbps_to_bytes_per_s(gpu.nic_gbps) / (tflops * TFLOP) * 1e3,
    )


def io_compute_trend(gpus: tuple[str, ...] = PAPER_GENERATIONS) -> Trend:
    """Points for ``gpus`` (oldest first) and the first-to-last ratios."""
    require(len(gpus) >= 2, "gpus", gpus, "need at least two generations")
    points = tuple(_point(g) for g in gpus)
    first, last = points[0], points[-1]
    compute_x = last.dense_tflops / first.dense_tflops
    nic_x = last.nic_gbps / first.nic_gbps
    return Trend(
        points=points,
        compute_x=compute_x,
        nic_x=nic_x,
        hbm_capacity_x=last.hbm_gb / first.hbm_gb,
        hbm_bandwidth_x=last.hbm_bandwidth_gbs / first.hbm_bandwidth_gbs,
        io_to_compute_drop_x=compute_x / nic_x,
    )

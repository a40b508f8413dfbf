"""What a roofline needs from an accelerator: the ``Device`` Protocol, and the NPU ``DeviceSpec``.

A device is peak FLOP/s for an operand width, memory bytes/s and memory capacity. ``GPUSpec``
(spec/hardware.py) implements it from its datasheet dtype table (an unsupported width runs at the
next wider one); ``DeviceSpec`` is one point of the planner's NPU design space (a compute tier x a
memory point, planner/catalog.py) whose compute is precision independent: a narrower operand
shrinks bytes, not the time per FLOP (heteropanacea.md, section III).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from dualpath.core.errors import ConfigError, require

BITS = (4, 8, 16)
MEMORY_FAMILIES = ("sram", "hbm", "gddr", "lpddr", "ddr")


@runtime_checkable
class Device(Protocol):
    """An accelerator as the roofline sees it."""

    @property
    def name(self) -> str: ...

    def peak_flops(self, bits: int) -> float:
        """Dense FLOP/s for operands of ``bits`` bits."""
        ...

    @property
    def mem_bytes_per_s(self) -> float: ...

    @property
    def capacity_bytes(self) -> float: ...


def check_bits(bits: int, key: str = "bits") -> int:
    """``bits`` if it is one of :data:`BITS`, else ``ConfigError`` (hot path: no message built)."""
    if bits not in BITS:
        raise ConfigError(key, bits, f"choices: {', '.join(map(str, BITS))}")
    return bits


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSpec:
    """One custom NPU: ``compute_tflops`` at any operand width, one memory of ``memory_family``
    with ``capacity_gb`` (decimal GB) at ``bandwidth_gbs`` (GB/s)."""

    name: str
    compute_tflops: float
    memory_family: str
    capacity_gb: float
    bandwidth_gbs: float

    def __post_init__(self) -> None:
        require(self.compute_tflops > 0, "compute_tflops", self.compute_tflops, "must be positive")
        require(
            self.memory_family in MEMORY_FAMILIES,
            "memory_family",
            self.memory_family,
            f"choices: {', '.join(MEMORY_FAMILIES)}",
        )
        require(self.capacity_gb > 0, "capacity_gb", self.capacity_gb, "must be positive")
        require(self.bandwidth_gbs > 0, "bandwidth_gbs", self.bandwidth_gbs, "must be positive")

    def peak_flops(self, bits: int) -> float:
        check_bits(bits)
        return self.compute_tflops * 1e12

    @property
    def mem_bytes_per_s(self) -> float:
        return self.bandwidth_gbs * 1e9

    @property
    def capacity_bytes(self) -> float:
        return self.capacity_gb * 1e9


def npu_name(compute_tflops: float, memory_family: str, capacity_gb: float) -> str:
    """``npu-25tf-hbm-190gb`` (capacities below 1 GB keep their decimals: ``sram-0.23gb``)."""
    return f"npu-{compute_tflops:g}tf-{memory_family}-{capacity_gb:g}gb"

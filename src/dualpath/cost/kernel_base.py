"""The table reader under cost/kernels.py's ``KernelTables``: one system's tables, its roofline.

:class:`KernelBase` holds the system, its tables (None: none on disk, ``missing`` says why), the
roofline efficiencies and the kin system's tables (``anchor``); it reads a table into a
:class:`~dualpath.cost.grid.Grid` (cached), names where a number comes from (:class:`OpTime`) and
re-times a kin system's measured point for a point ours lack (``_fallback``). The op families
(cost/kernels_attention.py, kernels_comm.py, kernels_moe.py) are subclasses that read through it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dualpath.cost.efficiency import DEFAULT_EFFICIENCY, Efficiency, roofline_s
from dualpath.cost.grid import Grid
from dualpath.cost.tables import PerfTables, select
from dualpath.spec.systems import SystemSpec

PREFERRED_SOURCES = (
    "torch_flow",
    "default",
    "vllm_flashinfer",
    "vllm_fused_moe",
    "moe_torch_flow",
    "moe_torch_flow_cutlass",
)


@dataclass(frozen=True, slots=True)
class OpTime:
    """Seconds of one operation on one GPU and where the number comes from."""

    time_s: float
    source: str

    def __mul__(self, factor: float) -> OpTime:
        return OpTime(self.time_s * factor, self.source)


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelBase:
    """The kernel tables of ``system`` (None: none on disk) and the roofline behind them."""

    system: SystemSpec
    tables: PerfTables | None
    missing: str = ""  # why there are no tables (the path looked at)
    efficiency: Efficiency = DEFAULT_EFFICIENCY
    anchor: KernelBase | None = None  # a kin system's tables for the points ours lack
    _grids: dict[tuple[Any, ...], Grid | None] = field(default_factory=dict)
    _layouts: dict[tuple[Any, ...], set[tuple[int, int]]] = field(default_factory=dict)

    def _fallback(
        self, time_s: float, why: str, op: Callable[[Any], OpTime], floor_s: float | None = None
    ) -> OpTime:
        """Our roofline ``time_s`` for a point our tables lack, unless the anchor system measured
        it: then the anchor's time plus the difference of the two rooflines (the measured fixed
        costs carry over, the ideal work is re-timed on our GPU and links), at least ``floor_s``
        (our roofline by default)."""
        if self.anchor is not None:
            theirs = op(self.anchor)
            if theirs.source.startswith("table"):
                bare = type(self.anchor)(
                    system=self.anchor.system, tables=None, efficiency=self.anchor.efficiency
                )
                floor = time_s if floor_s is None else floor_s
                time_s = max(theirs.time_s - op(bare).time_s + time_s, floor)
                return OpTime(time_s, f"{theirs.source} on {self.anchor.system.name} + roofline difference")
        return OpTime(time_s, why)

    def describe(self) -> dict[str, str]:
        """Which framework and version each op's tables were collected with, and their origin."""
        if self.tables is None:
            return {"all": self.missing}
        versions: dict[str, list[str]] = {}
        for op, framework, version, _ in self.tables.listing():
            entry = f"{framework} {version}"
            if entry not in versions.setdefault(op, []):
                versions[op].append(entry)
        out = {op: ", ".join(entries) for op, entries in versions.items()}
        out["origin"] = self.tables.origin
        return out

    # ---- table access ------------------------------------------------------------------------
    def _grid(
        self, op: str, table: str, axes: tuple[str, ...], growth: tuple[float, ...], **equal: object
    ) -> Grid | None:
        key = (op, table, axes, tuple(sorted(equal.items())))
        if key not in self._grids:
            frame = self.tables.frame(op, table) if self.tables is not None else None
            rows = select(frame, **equal)
            if rows is not None and "kernel_source" in rows.columns:
                present = set(rows["kernel_source"].tolist())
                pick = next((s for s in PREFERRED_SOURCES if s in present), sorted(present)[0])
                rows = select(rows, kernel_source=pick)
            self._grids[key] = None if rows is None else Grid.from_rows(rows, axes, growth)
        return self._grids[key]

    def _why_not(self, table: str, what: str) -> str:
        if self.tables is None:
            return f"roofline: {self.missing}"
        return f"roofline: no {table} rows for {what}"

    @staticmethod
    def _from(grid: Grid, table: str, *x: float) -> OpTime:
        value, extrapolated = grid.evaluate(*x)
        note = f" (extrapolated in {', '.join(extrapolated)})" if extrapolated else ""
        return OpTime(value, f"table {table}{note}")

    @property
    def launch_floor_s(self) -> float:
        """The fastest measured kernel: the smallest GEMM latency (of the kin system's tables when
        ours have none), else the system files' 3 us."""
        frame = self.tables.frame("gemm", "gemm_perf") if self.tables is not None else None
        if frame is None or not len(frame):
            return self.anchor.launch_floor_s if self.anchor is not None else self.efficiency.kernel_launch_s
        return float(frame["latency"].min()) * 1e-3

    # ---- roofline ----------------------------------------------------------------------------
    def roofline(
        self, flops: float, num_bytes: float, bits: int, compute_eff: float, memory_eff: float
    ) -> float:
        gpu = self.system.gpu
        return roofline_s(
            flops,
            num_bytes,
            gpu.peak_flops(bits),
            gpu.mem_bytes_per_s,
            compute_eff,
            memory_eff,
            1,
            self.efficiency.kernel_launch_s,
        )

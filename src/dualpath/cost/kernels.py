"""Per-operation GPU times from one system's measured kernel tables, roofline where none has a point.

Tables (aiconfigurator perf-db, latency in ms, see cost/tables.py for the layout) and how each is
read (the grid axes, in order, and the growth exponent used above the largest measured value):

- ``gemm_perf``: by ``gemm_dtype``; axes (n, k, m), growth 1 each (FLOPs grow linearly);
- ``context_attention_perf``: by (KV heads, head_dim, window, attention and KV dtype); axes
  (num_heads, isl, batch_size), growth (1, 2, 1): causal attention is quadratic in the prompt.
  A cached prefix of ``p`` tokens keeps the fraction ``(s^2 - p^2) / s^2`` of the pairs;
- ``generation_attention_perf``: axes (num_heads, batch_size, step = KV length), growth 1;
- ``context_mla_perf`` / ``generation_mla_perf``: MLA kernels, ``num_heads`` = heads per GPU;
- ``mla_{context,generation}_module_perf``: the whole MLA block of the DeepSeek-V3 shape
  (projections, attention, output projection) by ``gemm_type``;
- ``moe_perf``: by (hidden, inter, top-k, experts, moe_tp, moe_ep, dtype, routing distribution:
  the asked one, ``balanced`` where a shape was measured only balanced); axis num_tokens (the
  tokens the whole EP group routes), growth 1. A (moe_tp, moe_ep) the table lacks is read at a
  measured one with the same product (same expert bytes and FLOPs per GPU);
- ``custom_allreduce_perf`` (TensorRT-LLM's one-shot/two-shot kernel) and ``nccl_perf``: axes
  (message_size), per GPU count; ``message_size`` is an element count (cost/tables.py).

Every answer is an :class:`OpTime` whose ``source`` names the table, or says ``roofline`` (or
``ring``) and why. The roofline is cost/efficiency.py's ``roofline_s`` with its efficiencies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualpath.core.errors import ConfigError
from dualpath.cost.dtypes import DTYPE_BITS, DTYPE_BYTES
from dualpath.cost.efficiency import DEFAULT_EFFICIENCY, Efficiency, roofline_s
from dualpath.cost.grid import Grid
from dualpath.cost.kernels_moe import MoeKernels
from dualpath.cost.tables import PerfTables, open_tables, select
from dualpath.spec.systems import SystemSpec

# Where a system's tables have no point, the op is read from the kin system's tables and re-timed
# by the roofline difference (KernelTables._fallback): Blackwell from Hopper (B200 has only
# attention and MoE tables; GB200 none), the two Hoppers from each other.
ANCHOR_SYSTEMS = {"b200_sxm": "h200_sxm", "gb200": "b200_sxm", "h100_sxm": "h200_sxm", "h200_sxm": "h100_sxm"}
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
class KernelTables(MoeKernels):
    """The kernel tables of ``system`` (None: none on disk) and the roofline behind them."""

    system: SystemSpec
    tables: PerfTables | None
    missing: str = ""  # why there are no tables (the path looked at)
    efficiency: Efficiency = DEFAULT_EFFICIENCY
    anchor: KernelTables | None = None  # a kin system's tables for the points ours lack
    _grids: dict[tuple[Any, ...], Grid | None] = field(default_factory=dict)
    _layouts: dict[tuple[Any, ...], set[tuple[int, int]]] = field(default_factory=dict)

    @classmethod
    def load(
        cls, system: SystemSpec, data_dir: str | Path | None = None, *, _seen: tuple[str, ...] = ()
    ) -> KernelTables:
        """The data folder's tables, else the bundled ones (cost/tables.py ``open_tables``);
        none (every op by roofline, ``missing`` says why) when neither has ``system``'s. The
        ``ANCHOR_SYSTEMS`` kin is loaded beside them (see ``_fallback``)."""
        from dualpath.spec.systems import get_system

        seen = (*_seen, system.name)
        kin = ANCHOR_SYSTEMS.get(system.name)
        anchor = None
        if kin is not None and kin not in seen:
            anchor = cls.load(get_system(kin), data_dir, _seen=seen)
            if anchor.tables is None and anchor.anchor is None:
                anchor = None
        try:
            return cls(system=system, tables=open_tables(system.perf_db, data_dir), anchor=anchor)
        except ConfigError as exc:
            return cls(system=system, tables=None, missing=str(exc), anchor=anchor)

    def _fallback(
        self, time_s: float, why: str, op: Callable[[KernelTables], OpTime], floor_s: float | None = None
    ) -> OpTime:
        """Our roofline ``time_s`` for a point our tables lack, unless the anchor system measured
        it: then the anchor's time plus the difference of the two rooflines (the measured fixed
        costs carry over, the ideal work is re-timed on our GPU and links), at least ``floor_s``
        (our roofline by default)."""
        if self.anchor is not None:
            theirs = op(self.anchor)
            if theirs.source.startswith("table"):
                bare = KernelTables(system=self.anchor.system, tables=None, efficiency=self.anchor.efficiency)
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

    # ---- operations --------------------------------------------------------------------------
    def gemm(self, m: float, n: int, k: int, dtype: str) -> OpTime:
        """``[m x k] @ [k x n]`` with weights (and activations) of ``dtype``."""
        grid = self._grid("gemm", "gemm_perf", ("n", "k", "m"), (1, 1, 1), gemm_dtype=dtype)
        if grid is not None:
            return self._from(grid, f"gemm_perf {dtype}", n, k, m)
        eff = self.efficiency
        b = DTYPE_BYTES[dtype]
        time_s = self.roofline(
            2.0 * m * n * k,
            (m * k + m * n) * 2 + n * k * b,
            DTYPE_BITS[dtype],
            eff.gemm_compute(1 if b <= 1 else 2),
            eff.gemm_memory,
        )
        return self._fallback(time_s, self._why_not("gemm_perf", dtype), lambda kt: kt.gemm(m, n, k, dtype))

    def context_attention(
        self,
        *,
        batch: float,
        isl: float,
        prefix: float,
        heads: int,
        kv_heads: int,
        head_dim: int,
        kv_dtype: str,
        window: int = 0,
    ) -> OpTime:
        """Causal prefill attention of ``batch`` prompts of ``isl`` new tokens after ``prefix``."""
        full = isl + prefix
        keep = (full * full - prefix * prefix) / (full * full)
        grid = self._grid(
            "attention",
            "context_attention_perf",
            ("num_heads", "isl", "batch_size"),
            (1, 2, 1),
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            window_size=window,
            attn_dtype="bfloat16",
            kv_cache_dtype=kv_dtype,
        )
        if grid is not None:
            return self._from(grid, "context_attention_perf", heads, full, batch) * keep
        pairs = batch * isl * (isl + 1) / 2 + batch * isl * prefix
        if window:
            pairs = min(pairs, batch * isl * window)
        kv_bytes = batch * full * 2 * kv_heads * head_dim * DTYPE_BYTES[kv_dtype]
        eff = self.efficiency
        time_s = self.roofline(
            4.0 * heads * head_dim * pairs, kv_bytes, 16, eff.attention_compute, eff.attention_memory
        )
        return self._fallback(
            time_s,
            self._why_not("context_attention_perf", f"{kv_heads} KV heads x {head_dim}, window {window}"),
            lambda kt: kt.context_attention(
                batch=batch,
                isl=isl,
                prefix=prefix,
                heads=heads,
                kv_heads=kv_heads,
                head_dim=head_dim,
                kv_dtype=kv_dtype,
                window=window,
            ),
        )

    def generation_attention(
        self,
        *,
        batch: float,
        kv_len: float,
        heads: int,
        kv_heads: int,
        head_dim: int,
        kv_dtype: str,
        window: int = 0,
    ) -> OpTime:
        """One decode token for each of ``batch`` requests over ``kv_len`` cached tokens."""
        grid = self._grid(
            "attention",
            "generation_attention_perf",
            ("num_heads", "batch_size", "step"),
            (1, 1, 1),
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            window_size=window,
            kv_cache_dtype=kv_dtype,
        )
        if grid is not None:
            return self._from(grid, "generation_attention_perf", heads, batch, kv_len)
        keys = min(kv_len, window) if window else kv_len
        kv_bytes = batch * keys * 2 * kv_heads * head_dim * DTYPE_BYTES[kv_dtype]
        eff = self.efficiency
        time_s = self.roofline(
            4.0 * heads * head_dim * keys * batch, kv_bytes, 16, eff.attention_compute, eff.attention_memory
        )
        return self._fallback(
            time_s,
            self._why_not("generation_attention_perf", f"{kv_heads} KV heads x {head_dim}, window {window}"),
            lambda kt: kt.generation_attention(
                batch=batch,
                kv_len=kv_len,
                heads=heads,
                kv_heads=kv_heads,
                head_dim=head_dim,
                kv_dtype=kv_dtype,
                window=window,
            ),
        )

    def mla_module(
        self, phase: str, *, batch: float, length: float, heads: int, gemm_dtype: str, kv_dtype: str
    ) -> OpTime | None:
        """The whole DeepSeek-V3 MLA block (None when no module table has this point)."""
        table = f"mla_{phase}_module_perf"
        axis = "isl" if phase == "context" else "step"
        grid = self._grid(
            "mla",
            table,
            ("num_heads", "batch_size", axis),
            (1, 1, 2 if phase == "context" else 1),
            gemm_type=gemm_dtype,
            kv_cache_dtype=kv_dtype,
        )
        return None if grid is None else self._from(grid, f"{table} {gemm_dtype}", heads, batch, length)

    def mla_kernel(
        self,
        phase: str,
        *,
        batch: float,
        length: float,
        heads: int,
        kv_dtype: str,
        flops: float,
        num_bytes: float,
    ) -> OpTime:
        """MLA attention kernel alone (``flops`` / ``num_bytes`` for the roofline fallback)."""
        table = f"{phase}_mla_perf"
        axis = "isl" if phase == "context" else "step"
        grid = self._grid(
            "mla",
            table,
            ("num_heads", "batch_size", axis),
            (1, 1, 2 if phase == "context" else 1),
            kv_cache_dtype=kv_dtype,
        )
        if grid is not None:
            return self._from(grid, table, heads, batch, length)
        eff = self.efficiency
        return self._fallback(
            self.roofline(flops, num_bytes, 16, eff.attention_compute, eff.attention_memory),
            self._why_not(table, f"{heads} heads"),
            lambda kt: kt.mla_kernel(
                phase,
                batch=batch,
                length=length,
                heads=heads,
                kv_dtype=kv_dtype,
                flops=flops,
                num_bytes=num_bytes,
            ),
        )

    def _hierarchical(
        self, op: str, elements: float, num_gpus: int, dtype_bytes: float, backend: str
    ) -> OpTime:
        """``op`` over ``nodes`` NVLink domains, as NCCL runs it hierarchically: the collective
        inside each domain (its table), and between the domains each GPU exchanges its
        ``1 / domain`` share of the buffer with its peers over the network (a ring of ``nodes``:
        ``2 (nodes - 1) / nodes`` of that share for an all-reduce, ``(nodes - 1) / nodes`` for the
        others), plus one point-to-point latency per hop between domains."""
        domain = self.system.nvlink_domain_gpus
        nodes = num_gpus // domain
        inside = self.collective(
            op, elements=elements, num_gpus=domain, dtype_bytes=dtype_bytes, backend=backend
        )
        share = (2.0 if op == "all_reduce" else 1.0) * (nodes - 1) / nodes
        wire_s = share * elements / domain * dtype_bytes / (self.system.inter_node_gbs * 1e9)
        between_s = wire_s + (nodes - 1) * self.system.p2p_latency_s
        return OpTime(
            inside.time_s + between_s, f"{inside.source} within each node + ring of {nodes} nodes between"
        )

    def collective(
        self, op: str, *, elements: float, num_gpus: int, dtype_bytes: float = 2.0, backend: str = "trtllm"
    ) -> OpTime:
        """``op`` (all_reduce, all_gather, reduce_scatter, alltoall) of ``elements`` values."""
        if num_gpus <= 1 or elements <= 0:
            return OpTime(0.0, "none (one GPU)")
        if op == "all_reduce" and backend == "trtllm" and dtype_bytes == 2.0:
            grid = self._grid(
                "comm",
                "custom_allreduce_perf",
                ("message_size",),
                (1,),
                num_gpus=num_gpus,
                allreduce_dtype="bfloat16",
            )
            if grid is not None:
                return self._from(grid, f"custom_allreduce_perf {num_gpus} GPUs", elements)
        nccl_dtype = "half" if dtype_bytes >= 2 else "int8"
        grid = self._grid(
            "comm", "nccl_perf", ("message_size",), (1,), op_name=op, num_gpus=num_gpus, nccl_dtype=nccl_dtype
        )
        if grid is not None:
            return self._from(grid, f"nccl_perf {op} {num_gpus} GPUs", elements)
        domain = self.system.nvlink_domain_gpus
        if num_gpus > domain and num_gpus % domain == 0 and domain > 1:
            return self._hierarchical(op, elements, num_gpus, dtype_bytes, backend)
        # ring: all-reduce moves 2 (n-1)/n of the buffer per GPU, the others (n-1)/n
        share = (2.0 if op == "all_reduce" else 1.0) * (num_gpus - 1) / num_gpus
        wire_s = share * elements * dtype_bytes / self.system.link_bytes_per_s(num_gpus)
        return self._fallback(
            wire_s + (num_gpus - 1) * self.system.p2p_latency_s,
            f"ring over {num_gpus} GPUs ({self._why_not('nccl_perf', op)[10:]})",
            lambda kt: kt.collective(
                op, elements=elements, num_gpus=num_gpus, dtype_bytes=dtype_bytes, backend=backend
            ),
            floor_s=wire_s,
        )

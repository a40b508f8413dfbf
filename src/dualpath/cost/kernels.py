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

from pathlib import Path

from dualpath.core.errors import ConfigError
from dualpath.cost.dtypes import DTYPE_BITS, DTYPE_BYTES
from dualpath.cost.kernel_base import PREFERRED_SOURCES, KernelBase, OpTime
from dualpath.cost.kernels_attention import AttentionKernels
from dualpath.cost.kernels_comm import CUSTOM_ALLREDUCE_MAX_BYTES, CollectiveKernels
from dualpath.cost.kernels_moe import MoeKernels
from dualpath.cost.tables import open_tables
from dualpath.spec.systems import SystemSpec, get_system

__all__ = [
    "ANCHOR_SYSTEMS",
    "CUSTOM_ALLREDUCE_MAX_BYTES",
    "DTYPE_BITS",
    "DTYPE_BYTES",
    "PREFERRED_SOURCES",
    "KernelBase",
    "KernelTables",
    "OpTime",
]

# Where a system's tables have no point, the op is read from the kin system's tables and re-timed
# by the roofline difference (KernelBase._fallback): Blackwell from Hopper (B200 has only
# attention and MoE tables; GB200 none), the two Hoppers from each other.
ANCHOR_SYSTEMS = {"b200_sxm": "h200_sxm", "gb200": "b200_sxm", "h100_sxm": "h200_sxm", "h200_sxm": "h100_sxm"}


class KernelTables(AttentionKernels, CollectiveKernels, MoeKernels):
    """The kernel tables of ``system`` (None: none on disk) and the roofline behind them: GEMMs
    here, attention in cost/kernels_attention.py, collectives in kernels_comm.py, routed experts
    in kernels_moe.py, the table reading in kernel_base.py."""

    __slots__ = ()

    @classmethod
    def load(
        cls, system: SystemSpec, data_dir: str | Path | None = None, *, _seen: tuple[str, ...] = ()
    ) -> KernelTables:
        """The data folder's tables, else the bundled ones (cost/tables.py ``open_tables``);
        none (every op by roofline, ``missing`` says why) when neither has ``system``'s. The
        ``ANCHOR_SYSTEMS`` kin is loaded beside them (see ``_fallback``)."""
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

"""Attention times (GQA / MHA context and generation kernels, the MLA module and kernel tables).

The tables and their axes are cost/kernels.py's module doc; each op falls back to the roofline (or
the kin system's table, ``KernelBase._fallback``) where this system's tables have no point.
"""

from __future__ import annotations

from dualpath.cost.dtypes import DTYPE_BYTES
from dualpath.cost.kernel_base import KernelBase, OpTime


class AttentionKernels(KernelBase):
    """The attention ops of ``KernelTables`` (cost/kernels.py)."""

    __slots__ = ()

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

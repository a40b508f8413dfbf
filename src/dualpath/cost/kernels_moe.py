"""Routed-expert times from the ``moe_perf`` table (the MoE ops of cost/kernels.py ``KernelTables``).

The table is keyed by (hidden, inter, top-k, experts, moe_tp, moe_ep, dtype, routing
distribution) with one axis, ``num_tokens`` (the tokens the whole EP group routes). A query is
answered, in order of preference, by:

1. the asked layout, routing and dtype (routing: the asked one, else ``balanced``);
2. a measured layout with the same GPU count (same expert bytes and FLOPs per GPU), closest in
   moe_tp: the source says "tpA epB for tpC epD";
3. an *anchor*: the nearest measured point of the same expert shape at another GPU count or dtype,
   plus the difference of the two roofline times (``moe_roofline_s``): the kernel's measured fixed
   costs (routing, permutes, grouped-GEMM launches: tens of microseconds whatever the bytes) carry
   over, and the ideal work it gains or loses is added (with less work the result stays above the
   anchor scaled by the roofline ratio, since a measured kernel is slower than its roofline).
   The source says "... + roofline difference to ...";
4. the kin system's table (``KernelTables._fallback``), else the roofline alone, when this
   system's table has no point of the shape at all.

Rung 3 exists because the bare roofline is far below the measured kernels at few tokens (the
grouped GEMMs, routing and permutes cost tens of microseconds whatever the bytes): mixing table
and roofline layouts would make, e.g., gpt-oss at TP1 (no MXFP4 table point) faster than at TP2
(docs/notes/cost-prefill-packing.md has the history of both).
"""

from __future__ import annotations

import math

from dualpath.cost.dtypes import DTYPE_BITS, DTYPE_BYTES
from dualpath.cost.grid import Grid
from dualpath.cost.kernel_base import KernelBase, OpTime
from dualpath.cost.tables import select


class MoeKernels(KernelBase):
    """The routed-expert ops of ``KernelTables`` (cost/kernels.py), read through its tables."""

    __slots__ = ()

    def moe(
        self,
        *,
        tokens: float,
        hidden: int,
        inter: int,
        topk: int,
        experts: int,
        moe_tp: int,
        moe_ep: int,
        dtype: str,
        distribution: str = "balanced",
    ) -> OpTime:
        """Routed experts of one MoE layer on one GPU when the EP group routes ``tokens`` with
        the measured token-to-expert ``distribution`` (see the module doc for the fallbacks)."""
        base: dict[str, object] = dict(hidden_size=hidden, inter_size=inter, topk=topk, num_experts=experts)
        routings = tuple(dict.fromkeys((distribution, "balanced")))
        measured = self._moe_measured(base, routings, tokens, dtype, moe_tp, moe_ep)
        if measured is not None:
            return measured
        ideal = self.moe_roofline_s(tokens, hidden, inter, topk, experts, moe_tp, moe_ep, dtype)
        dims = (hidden, inter, topk, experts)
        anchored = self._moe_anchored(base, dims, routings, tokens, dtype, moe_tp, moe_ep, ideal)
        if anchored is not None:
            return anchored
        what = f"{experts}x{hidden}x{inter} top{topk} {dtype} tp{moe_tp} ep{moe_ep}"
        return self._fallback(
            ideal,
            self._why_not("moe_perf", what),
            lambda kt: kt.moe(
                tokens=tokens,
                hidden=hidden,
                inter=inter,
                topk=topk,
                experts=experts,
                moe_tp=moe_tp,
                moe_ep=moe_ep,
                dtype=dtype,
                distribution=distribution,
            ),
        )

    def _moe_measured(
        self,
        base: dict[str, object],
        routings: tuple[str, ...],
        tokens: float,
        dtype: str,
        moe_tp: int,
        moe_ep: int,
    ) -> OpTime | None:
        """Rungs 1 and 2 of the module doc: the asked layout, else one with the same GPU count."""
        for routing in routings:
            shape = {**base, "distribution": routing, "moe_dtype": dtype}
            layout = self._same_gpus(self._moe_layouts(shape), moe_tp, moe_ep)
            if layout is not None:
                note = "" if layout == (moe_tp, moe_ep) else f" for tp{moe_tp} ep{moe_ep}"
                name = f"moe_perf {dtype} {routing} tp{layout[0]} ep{layout[1]}{note}"
                return self._from(self._moe_grid(shape, layout), name, tokens)
        return None

    def _moe_anchored(
        self,
        base: dict[str, object],
        dims: tuple[int, int, int, int],
        routings: tuple[str, ...],
        tokens: float,
        dtype: str,
        moe_tp: int,
        moe_ep: int,
        ideal: float,
    ) -> OpTime | None:
        """Rung 3: the nearest measured point plus the roofline difference (``ideal``: ours;
        ``dims``: hidden, inter, top-k, experts)."""
        anchor = self._moe_anchor(base, routings, dtype, moe_tp, moe_ep)
        if anchor is None:
            return None
        shape, (t, e) = anchor
        a_dtype = str(shape["moe_dtype"])
        measured = self._from(self._moe_grid(shape, (t, e)), "", tokens).time_s
        ideal_anchor = self.moe_roofline_s(tokens, *dims, t, e, a_dtype)
        time_s = measured + ideal - ideal_anchor  # >= measured x ideal / ideal_anchor when less work
        return OpTime(
            time_s,
            f"table moe_perf {a_dtype} {shape['distribution']} tp{t} ep{e} + roofline difference "
            f"to {dtype} tp{moe_tp} ep{moe_ep}",
        )

    def moe_roofline_s(
        self,
        tokens: float,
        hidden: int,
        inter: int,
        topk: int,
        experts: int,
        moe_tp: int,
        moe_ep: int,
        dtype: str,
    ) -> float:
        """Roofline time of one GPU's routed experts: the local experts the tokens hit (uniform
        routing) streamed once, the FLOPs of its share of the token-expert pairs."""
        local = experts / moe_ep
        hit = 1.0 - (1.0 - topk / experts) ** max(tokens, 0.0)
        weights = local * hit * 3 * hidden * inter / moe_tp * DTYPE_BYTES[dtype]
        flops = 2.0 * 3 * hidden * inter / moe_tp * tokens * topk / moe_ep
        eff = self.efficiency
        return float(self.roofline(flops, weights, DTYPE_BITS[dtype], eff.moe_compute, eff.moe_memory))

    # ---- table access ------------------------------------------------------------------------
    def _moe_grid(self, shape: dict[str, object], layout: tuple[int, int]) -> Grid:
        grid = self._grid_of(shape, layout)
        assert grid is not None
        return grid

    def _grid_of(self, shape: dict[str, object], layout: tuple[int, int]) -> Grid | None:
        return self._grid(
            "moe", "moe_perf", ("num_tokens",), (1,), moe_tp_size=layout[0], moe_ep_size=layout[1], **shape
        )

    def _moe_layouts(self, shape: dict[str, object]) -> set[tuple[int, int]]:
        """The (moe_tp, moe_ep) layouts measured for ``shape`` (cached)."""
        key = tuple(sorted(shape.items()))
        if key not in self._layouts:
            frame = self.tables.frame("moe", "moe_perf") if self.tables is not None else None
            rows = select(frame, **shape)
            self._layouts[key] = (
                set()
                if rows is None
                else set(zip(rows["moe_tp_size"].tolist(), rows["moe_ep_size"].tolist(), strict=True))
            )
        return self._layouts[key]

    @staticmethod
    def _same_gpus(have: set[tuple[int, int]], moe_tp: int, moe_ep: int) -> tuple[int, int] | None:
        """The asked layout, else the measured one with the same GPU count closest in moe_tp."""
        if (moe_tp, moe_ep) in have:
            return moe_tp, moe_ep
        same = [(t, e) for t, e in have if t * e == moe_tp * moe_ep]
        return min(same, key=lambda te: (abs(te[0] - moe_tp), te)) if same else None

    def _moe_anchor(
        self, base: dict[str, object], routings: tuple[str, ...], dtype: str, moe_tp: int, moe_ep: int
    ) -> tuple[dict[str, object], tuple[int, int]] | None:
        """The nearest measured point of this expert shape: the same dtype first, then the
        dtypes closest in weight bytes; within one, the GPU count closest (in ratio), then moe_tp."""
        if self.tables is None:
            return None
        dtypes = sorted(DTYPE_BYTES, key=lambda d: (d != dtype, abs(DTYPE_BYTES[d] - DTYPE_BYTES[dtype]), d))
        gpus = moe_tp * moe_ep
        for d in dtypes:
            for routing in routings:
                shape = {**base, "distribution": routing, "moe_dtype": d}
                have = self._moe_layouts(shape)
                if have:
                    best = min(
                        have, key=lambda te: (abs(math.log(te[0] * te[1] / gpus)), abs(te[0] - moe_tp), te)
                    )
                    return shape, best
        return None

"""The ablation findings (docs/planner.md, "Findings under the defaults"): PDAF x ND as one model factor moves, at a fixed
budget, read off ``ablate`` objects (findings.py assembles the whole table)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def row(
    fid: str, text: str, published: str, ours: str, ok: bool | None, fitted: bool = False
) -> dict[str, Any]:
    """One findings row (``came_out`` None: reported, no published shape to check)."""
    return {
        "id": fid,
        "finding": text,
        "published": published,
        "ours": ours,
        "came_out": ok,
        "fitted": fitted,
    }


_row = row


def _change(abl: Mapping, model: str, frm: float, to: float) -> float | None:
    pts = {r["value"]: r["x_nd"].get("pdaf") for r in abl["rows"] if r["model"] == model}
    a, b = pts.get(frm), pts.get(to)
    return None if not a or b is None else b / a - 1.0


def ablation_rows(abl: Mapping[str, Mapping]) -> list[dict]:
    rows = []
    if "kv_width" in abl:
        a = abl["kv_width"]
        lo, hi = min(a["values"]), max(a["values"])
        ch, mono = {}, True
        for m in a["models"]:
            ch[m] = _change(a, m, lo, hi)
            seq = [
                r["x_nd"].get("pdaf")
                for r in sorted((r for r in a["rows"] if r["model"] == m), key=lambda r: r["value"])
            ]
            mono = mono and None not in seq and all(y >= x for x, y in zip(seq, seq[1:], strict=False))
        rows.append(
            _row(
                "abl_kv_width",
                f"kv_width {lo:g} -> {hi:g} raises the PDAF gain monotonically",
                "+67% to +147%",
                _pct(ch) + f"; monotone: {mono}",
                mono and all(v is not None and v > 0 for v in ch.values()),
            )
        )
    if "total_experts_x" in abl:
        a = abl["total_experts_x"]
        ch = {m: _change(a, m, min(a["values"]), max(a["values"])) for m in a["models"]}
        rows.append(
            _row(
                "abl_total_experts",
                "More total experts changes almost nothing",
                "<= 3%",
                _pct(ch),
                all(v is not None and abs(v) <= 0.05 for v in ch.values()),
            )
        )
    for factor, fid in (("active_experts_x", "abl_active_experts"), ("ffn_expansion", "abl_ffn_expansion")):
        if factor in abl:
            a = abl[factor]
            to = 4.0 if 4.0 in a["values"] else max(a["values"])
            ch = {m: _change(a, m, min(a["values"]), to) for m in a["models"]}
            flash = ch.get("deepseek-v4-flash")
            if factor == "active_experts_x":
                rows.append(
                    _row(
                        fid,
                        f"More active experts collapses the gain (x{to:g})",
                        "-69% at 4x for DS-V4-Flash",
                        _pct(ch),
                        flash is not None and flash < -0.3,
                    )
                )
            else:
                rows.append(
                    _row(
                        fid,
                        f"ffn_expansion x{to:g}, next to active experts (same expert-compute proxy)",
                        "same ordering, much smaller effect",
                        _pct(ch),
                        None,
                    )
                )
    if "dtype_bytes" in abl:
        a = abl["dtype_bytes"]
        ch = {m: _change(a, m, 2.0, min(a["values"])) for m in a["models"]}
        gpt = ch.get("gpt-oss-120b")
        others = [v for m, v in ch.items() if m != "gpt-oss-120b" and v is not None]
        rows.append(
            _row(
                "abl_dtype_bytes",
                f"dtype_bytes 2 -> {min(a['values']):g} helps GPT-OSS and hurts the others",
                "GPT-OSS +57%; others -41%, -42%",
                _pct(ch),
                gpt is not None and gpt > 0 and bool(others) and all(v < 0 for v in others),
            )
        )
    return rows


def _pct(changes: Mapping[str, float | None]) -> str:
    return ", ".join(f"{m}: {'n/a' if v is None else f'{v:+.0%}'}" for m, v in changes.items())

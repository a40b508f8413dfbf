"""Balance metrics as the paper reports them (spec section 10): max/avg of per-SNIC traffic across
nodes and of per-GPU attention time inside an engine group. Pure functions of plain numbers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dualpath.core.errors import DualpathError


def max_over_avg(values: Iterable[float]) -> float:
    """``max / mean`` of ``values`` (1.0 = perfectly balanced). All-zero input counts as balanced
    (1.0); empty or negative input is an error."""
    vals = [float(v) for v in values]
    if not vals:
        raise DualpathError("max_over_avg of an empty sequence")
    if min(vals) < 0:
        raise DualpathError(f"max_over_avg needs values >= 0, got {min(vals)!r}")
    total = sum(vals)
    if total == 0:
        return 1.0
    return max(vals) * len(vals) / total


def snic_traffic_balance(bytes_by_snic: Mapping[Any, float] | Sequence[float]) -> float:
    """max/avg of bytes moved per SNIC over a run (the paper: 1.53 round robin -> 1.18 DualPath).
    Pass every SNIC that could have carried reads (idle ones as 0), or the ratio is flattered."""
    values = bytes_by_snic.values() if isinstance(bytes_by_snic, Mapping) else bytes_by_snic
    return max_over_avg(values)


def attention_time_balance(step_times_s: Iterable[Sequence[float]]) -> float:
    """Mean over synchronised steps of max/avg attention time across a group's GPUs (the paper:
    1.06 inside an EP group). Each element holds one step's per-GPU attention seconds; steps where
    every GPU was idle are skipped. Returns 1.0 when no step had work."""
    ratios = [max_over_avg(step) for step in step_times_s if step and sum(step) > 0]
    return sum(ratios) / len(ratios) if ratios else 1.0


def bubble_fraction(step_times_s: Iterable[Sequence[float]]) -> float:
    """Share of GPU-time lost to waiting for the slowest GPU at each synchronised step:
    ``sum(max - t) / sum(max)`` over steps and GPUs (0 = no bubbles)."""
    lost = 0.0
    held = 0.0
    for step in step_times_s:
        if not step:
            continue
        top = max(step)
        lost += sum(top - t for t in step)
        held += top * len(step)
    return lost / held if held > 0 else 0.0

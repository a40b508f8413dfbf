"""What one simulated engine rank needs besides its batch rules: the forward pass read through the
memo (latency/memo.py), the backend's scheduler defaults for the row's version, and its KV pool."""

from __future__ import annotations

from dataclasses import replace

from dualpath.cost.deployment import Deployment
from dualpath.cost.forward import Forward
from dualpath.cost.memory import max_requests_per_rank
from dualpath.latency.defaults import SchedulerDefaults, scheduler_defaults
from dualpath.latency.memo import memo_kernels


def memoised(fw: Forward) -> Forward:
    """``fw`` reading its kernel tables through the process-wide memo."""
    return replace(fw, kernels=memo_kernels(fw.kernels))


def defaults_for(dep: Deployment, fw: Forward) -> SchedulerDefaults:
    """``dep.backend``'s defaults at ``dep.backend_version`` on ``fw``'s GPU."""
    return scheduler_defaults(dep.backend, dep.backend_version, fw.kernels.system.gpu.capacity_bytes)


def kv_capacity_tokens(fw: Forward, isl: int, osl: int) -> tuple[float, list[str]]:
    """One attention rank's KV pool (cost/memory.py, the backend's sizing rule) in tokens of
    ``isl + osl``-token requests, and a note when the weights leave room for less than one (then
    a pool of one request: the measurement ran, so the memory estimate is what is off)."""
    length = isl + osl
    cap = max_requests_per_rank(fw.model, fw.par, fw.prec, fw.kernels.system.gpu, length, fw.backend)
    if cap < 1:
        return float(length), [
            f"the KV pool holds {max(cap, 0):.2f} requests of {length} tokens per rank (cost/memory.py); "
            "simulated with room for one"
        ]
    return cap * length, []

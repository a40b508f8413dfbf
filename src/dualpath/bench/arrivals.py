"""When requests (or agents) arrive: all at once, gamma/Poisson gaps, or a trace's own timestamps.

Same conventions as ``vllm bench serve``: ``rate`` inf sends everything at time 0; otherwise the
gaps are gamma distributed with shape ``burstiness`` and mean ``1 / rate`` (burstiness 1 =
Poisson), accumulated, then rescaled so the last arrival falls exactly at ``n / rate`` (which
keeps the offered load the same across seeds). Seeded: same arguments, same times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def arrival_times_s(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """``n`` non-decreasing arrival times in seconds from the start of the run."""
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    rng = np.random.default_rng([seed, 7])
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    times = np.cumsum(gaps)
    times *= (n / rate) / times[-1]
    return [float(t) for t in times]


def trace_times_s(timestamps_s: Sequence[float], time_scale: float = 1.0) -> list[float]:
    """A trace's own timing: seconds since its first record, divided by ``time_scale``
    (2 = twice as fast). Records out of order keep their offsets (never negative)."""
    if not timestamps_s:
        return []
    first = min(timestamps_s)
    return [(t - first) / time_scale for t in timestamps_s]

"""Closed-form analysis: bottleneck-free P/D range, cache-compute ratio, working set, hardware trend."""

from dualpath.analysis.cache_ratio import CacheRatio, cache_compute_ratio, cache_compute_ratios
from dualpath.analysis.pd_range import PDRange, pd_range
from dualpath.analysis.trend import GenerationPoint, Trend, io_compute_trend
from dualpath.analysis.working_set import WorkingSet, working_set

__all__ = [
    "CacheRatio",
    "GenerationPoint",
    "PDRange",
    "Trend",
    "WorkingSet",
    "cache_compute_ratio",
    "cache_compute_ratios",
    "io_compute_trend",
    "pd_range",
    "working_set",
]

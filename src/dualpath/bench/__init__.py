"""dualpath.bench: agent and trace replay against any OpenAI-compatible endpoint (docs/bench.md).

Results use ``vllm bench serve``'s JSON keys and console block, plus agent metrics. Imports core,
spec, workload, analysis, numpy, httpx and matplotlib only (no torch, no server code).
"""

from __future__ import annotations

from dualpath.bench.config import BenchConfig
from dualpath.bench.console import format_summary
from dualpath.bench.report import detailed, plot_cdfs, summarize
from dualpath.bench.runner import BenchRun, run_bench

__all__ = ["BenchConfig", "BenchRun", "detailed", "format_summary", "plot_cdfs", "run_bench", "summarize"]

"""dualpath.bench: agent-trajectory replay against any OpenAI-compatible endpoint (docs/bench.md).

Imports core, spec, workload, analysis, httpx and matplotlib only (no torch, no server code).
"""

from __future__ import annotations

from dualpath.bench.config import BenchConfig
from dualpath.bench.report import plot_cdfs, request_rows, summarize
from dualpath.bench.runner import BenchRun, run_bench

__all__ = ["BenchConfig", "BenchRun", "plot_cdfs", "request_rows", "run_bench", "summarize"]

"""dualpath.bench: agent and trace replay against any OpenAI-compatible endpoint (docs/bench.md).

Results use ``vllm bench serve``'s JSON keys and console block, plus agent metrics. Imports core,
spec, workload, analysis, numpy, httpx and matplotlib only (no torch, no server code). Names are
imported on first use, so ``BenchConfig`` (and the CLI's defaults read from it) needs no httpx.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "BenchConfig": "config",
    "format_summary": "console",
    "detailed": "report",
    "plot_cdfs": "report",
    "summarize": "report",
    "BenchRun": "runner",
    "run_bench": "runner",
}

__all__ = ["BenchConfig", "BenchRun", "detailed", "format_summary", "plot_cdfs", "run_bench", "summarize"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)

"""dualpath.workload: agent trajectories (synthetic per Table 2, trace loaders) and replay semantics.

Imports only ``dualpath.core`` (and numpy). See docs/workload.md.
"""

from __future__ import annotations

from dualpath.workload.replay import (
    expand_agents,
    iter_turn_requests,
    scale_turns,
    truncate,
    with_poisson_arrivals,
)
from dualpath.workload.stats import STAT_COLUMNS, TABLE2, compare_to_table2, workload_stats
from dualpath.workload.synthetic import (
    BUCKET_PARAMS,
    SyntheticParams,
    generate_trajectories,
    params_for,
    resolve_maxlen,
)
from dualpath.workload.traces import (
    TRACE_ALIASES,
    TRACE_FILES,
    load_azure,
    load_jsonl,
    load_mooncake,
    load_trace,
    resolve_trace,
    save_jsonl,
)
from dualpath.workload.types import (
    SYNTHETIC_PREFIX_LEN,
    ReplayConfig,
    Trajectory,
    Turn,
    TurnRequest,
)

__all__ = [
    "BUCKET_PARAMS",
    "ReplayConfig",
    "STAT_COLUMNS",
    "SYNTHETIC_PREFIX_LEN",
    "SyntheticParams",
    "TABLE2",
    "TRACE_ALIASES",
    "TRACE_FILES",
    "Trajectory",
    "Turn",
    "TurnRequest",
    "compare_to_table2",
    "expand_agents",
    "generate_trajectories",
    "iter_turn_requests",
    "load_azure",
    "load_jsonl",
    "load_mooncake",
    "load_trace",
    "params_for",
    "resolve_maxlen",
    "resolve_trace",
    "save_jsonl",
    "scale_turns",
    "truncate",
    "with_poisson_arrivals",
    "workload_stats",
]

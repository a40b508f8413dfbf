"""Table 2 statistics of a set of trajectories, computed the way the paper's table reads.

Every column but the hit rate is a per-trajectory quantity averaged over trajectories (each
trajectory weighs the same, whatever its turn count):

- ``turns``: number of turns.
- ``append_per_turn`` / ``gen_per_turn``: the trajectory's mean append / generation length per turn.
- ``final_len``: context length after the last turn (all appends + all generations).
- ``context_len``: the trajectory's mean prompt length over its turns (``cached_len + append_len``
  of each turn, i.e. what prefill attends over).
- ``hit_rate``: ``1 - append_per_turn / context_len`` from the two averages above, exactly as the
  paper derives 98.7% for 64K. ``hit_rate_tokens`` (extra) is the token-weighted fraction
  ``1 - sum(appends) / sum(prompt lengths)`` over all turns of all trajectories.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dualpath.core.errors import ConfigError
from dualpath.workload.types import Trajectory

# The paper's Table 2 (spec section 1): 500 production coding-agent trajectories per MaxLen bucket.
TABLE2: dict[int, dict[str, float]] = {
    32768: {
        "turns": 60,
        "append_per_turn": 608,
        "gen_per_turn": 148,
        "final_len": 28639,
        "context_len": 17183,
    },
    49152: {
        "turns": 106,
        "append_per_turn": 474,
        "gen_per_turn": 172,
        "final_len": 42607,
        "context_len": 25120,
    },
    65536: {
        "turns": 157,
        "append_per_turn": 429,
        "gen_per_turn": 176,
        "final_len": 55958,
        "context_len": 32721,
    },
}
for _row in TABLE2.values():
    _row["hit_rate"] = 1.0 - _row["append_per_turn"] / _row["context_len"]

STAT_COLUMNS = ("turns", "append_per_turn", "gen_per_turn", "final_len", "context_len", "hit_rate")


def _per_trajectory(traj: Trajectory) -> tuple[float, float, float, float, float, float]:
    appends = np.fromiter((t.append_len for t in traj.turns), dtype=np.int64, count=traj.num_turns)
    gens = np.fromiter((t.gen_len for t in traj.turns), dtype=np.int64, count=traj.num_turns)
    steps = appends + gens
    # prompt of turn i = context after turn i-1 + append i
    prompts = np.cumsum(steps) - gens
    return (
        float(traj.num_turns),
        float(appends.mean()),
        float(gens.mean()),
        float(steps.sum()),
        float(prompts.mean()),
        float(prompts.sum()),
    )


def workload_stats(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Table 2 columns of ``trajs`` (see the module docstring for each definition), plus
    ``num_trajectories``, ``hit_rate_tokens``, ``max_final_len`` and ``total_turns``."""
    if not trajs:
        raise ConfigError("trajectories", 0, "need at least one trajectory for statistics")
    rows = np.array([_per_trajectory(t) for t in trajs], dtype=np.float64)
    turns, append, gen, final, context, prompt_sum = rows.mean(axis=0)
    total_append = float(sum(t.total_append_len for t in trajs))
    return {
        "num_trajectories": len(trajs),
        "turns": float(turns),
        "append_per_turn": float(append),
        "gen_per_turn": float(gen),
        "final_len": float(final),
        "context_len": float(context),
        "hit_rate": 1.0 - float(append) / float(context),
        "hit_rate_tokens": 1.0 - total_append / float(rows[:, 5].sum()),
        "max_final_len": int(rows[:, 3].max()),
        "total_turns": int(rows[:, 0].sum()),
    }


def compare_to_table2(stats: dict[str, float], maxlen: int) -> dict[str, float]:
    """Relative error ``stats / target - 1`` per Table 2 column for a calibrated bucket."""
    if maxlen not in TABLE2:
        raise ConfigError("maxlen", maxlen, f"no Table 2 row; rows: {sorted(TABLE2)}")
    target = TABLE2[maxlen]
    return {col: stats[col] / target[col] - 1.0 for col in STAT_COLUMNS}

"""Replay semantics (spec section 9): turn requests, agent expansion by cloning, scaling, truncation.

Pure functions of their inputs; the only randomness (which trajectory a clone copies) comes from
``ReplayConfig.seed`` through a numpy Generator, so the same config gives the same agents.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from dualpath.core.errors import ConfigError
from dualpath.workload.types import ReplayConfig, Trajectory, Turn, TurnRequest


def iter_turn_requests(traj: Trajectory, tool_latency_s: float = 0.0) -> Iterator[TurnRequest]:
    """Yield the requests an agent issues, in order.

    Turn ``i+1``'s prompt is turn ``i``'s context (prompt + generated tokens) plus its append, so
    ``cached_len`` of turn ``i+1`` equals ``context_len`` of turn ``i``. ``tool_latency_s`` is put on
    every turn but the first."""
    cached_len = 0
    for index, turn in enumerate(traj.turns):
        prompt_len = cached_len + turn.append_len
        yield TurnRequest(
            turn_index=index,
            cached_len=cached_len,
            append_len=turn.append_len,
            prompt_len=prompt_len,
            gen_len=turn.gen_len,
            tool_latency_s=tool_latency_s if index > 0 else 0.0,
        )
        cached_len = prompt_len + turn.gen_len


def scale_turns(
    traj: Trajectory, append_scale: float, gen_scale: float, skip_first: bool = False
) -> Trajectory:
    """Multiply every append and generation length (rounded half-even, at least 1 token).

    ``skip_first`` leaves the first turn alone (a clone's synthetic prefix)."""
    if append_scale == 1.0 and gen_scale == 1.0:
        return traj
    turns = []
    for index, turn in enumerate(traj.turns):
        if skip_first and index == 0:
            turns.append(turn)
            continue
        turns.append(
            Turn(
                append_len=max(1, int(round(turn.append_len * append_scale))),
                gen_len=max(1, int(round(turn.gen_len * gen_scale))),
            )
        )
    return Trajectory(traj.traj_id, tuple(turns), traj.arrival_s, traj.parent_id)


def truncate(traj: Trajectory, max_len: int) -> Trajectory:
    """Drop the first turn whose context would exceed ``max_len`` and every turn after it.

    If even the first turn overflows, it is kept shortened to fit exactly (generation capped at
    half of ``max_len``, the append fills the rest), so a trajectory never becomes empty."""
    kept: list[Turn] = []
    context_len = 0
    for turn in traj.turns:
        if context_len + turn.append_len + turn.gen_len > max_len:
            break
        kept.append(turn)
        context_len += turn.append_len + turn.gen_len
    if not kept:
        first = traj.turns[0]
        gen_len = max(1, min(first.gen_len, max_len // 2))
        kept.append(Turn(append_len=max_len - gen_len, gen_len=gen_len))
    if kept == list(traj.turns):
        return traj
    return Trajectory(traj.traj_id, tuple(kept), traj.arrival_s, traj.parent_id)


def _clone(parent: Trajectory, clone_index: int, prefix_len: int) -> Trajectory:
    prefix = Turn(append_len=prefix_len, gen_len=1)
    return Trajectory(
        f"{parent.traj_id}#c{clone_index}", (prefix, *parent.turns), parent.arrival_s, parent.traj_id
    )


def expand_agents(trajs: Sequence[Trajectory], cfg: ReplayConfig) -> list[Trajectory]:
    """Return exactly ``cfg.num_agents`` trajectories ready to replay.

    Fewer agents than trajectories: the first ``num_agents`` in order. More: every trajectory once,
    then ``num_agents - len(trajs)`` clones, each copying a trajectory drawn uniformly with
    replacement (seeded) and prefixed with a synthetic first turn of ``cfg.synthetic_prefix_len``
    random tokens and generation length 1, so no two agents share a prefix. Clone ids are
    ``<parent>#c<k>`` with ``k`` counting clones from 0. Scaling (not of the prefix turn) and then
    ``max_len`` truncation apply to every agent. Does not mutate ``trajs``."""
    if not trajs:
        raise ConfigError("trajectories", 0, "need at least one trajectory to replay")
    base = list(trajs[: cfg.num_agents])
    num_clones = cfg.num_agents - len(base)
    if num_clones > 0:
        rng = np.random.default_rng(cfg.seed)
        picks = rng.integers(0, len(trajs), size=num_clones)
        base.extend(_clone(trajs[int(p)], k, cfg.synthetic_prefix_len) for k, p in enumerate(picks))
    out = []
    for traj in base:
        traj = scale_turns(traj, cfg.append_scale, cfg.gen_scale, skip_first=traj.parent_id is not None)
        if cfg.max_len is not None:
            traj = truncate(traj, cfg.max_len)
        out.append(traj)
    return out


def with_poisson_arrivals(
    trajs: Sequence[Trajectory], rate_aps: float, seed: int = 0, start_s: float = 0.0
) -> list[Trajectory]:
    """Copies of ``trajs`` (same order) whose ``arrival_s`` follow a Poisson process of
    ``rate_aps`` agents per second starting at ``start_s`` (online experiments, spec section 9).
    Exponential gaps from ``numpy.random.default_rng(seed)``; the first agent arrives after one
    gap, not at ``start_s``."""
    if not rate_aps > 0:
        raise ConfigError("rate_aps", rate_aps, "must be > 0 agents per second")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_aps, size=len(trajs))
    arrivals = start_s + np.cumsum(gaps)
    return [
        Trajectory(t.traj_id, t.turns, float(a), t.parent_id) for t, a in zip(trajs, arrivals, strict=True)
    ]

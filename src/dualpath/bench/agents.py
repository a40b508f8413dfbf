"""Agents to replay: trajectories scaled to the endpoint's context, start times, token ids.

Token content is deterministic per (token seed, agent): turn ``i``'s prompt is the whole previous
context (prompt + generated tokens) followed by that turn's appended random ids, so a server with
a prefix cache sees exactly the reuse of the paper's agent workloads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dualpath.bench.arrivals import arrival_times_s
from dualpath.bench.config import BenchConfig
from dualpath.workload import (
    BUCKET_PARAMS,
    ReplayConfig,
    Trajectory,
    Turn,
    TurnRequest,
    expand_agents,
    generate_trajectories,
    iter_turn_requests,
    load_trace,
)

# Smallest calibrated MaxLen bucket of the synthetic generator. Shorter runs are made from it and
# scaled down, which keeps the bucket's turn structure (many short turns after a long first one);
# generating at a small MaxLen directly would clamp to these parameters and give one-turn agents.
CALIBRATED_MIN_MAXLEN = min(BUCKET_PARAMS)


@dataclass(frozen=True, slots=True, kw_only=True)
class Agent:
    """One agent: its turns (lengths as the server should see them) and start time."""

    index: int
    agent_id: str
    start_s: float
    turns: tuple[TurnRequest, ...]


def load_trajectories(cfg: BenchConfig) -> tuple[list[Trajectory], int]:
    """(trajectories, the length they were made for: the generator's MaxLen or the longest one)."""
    if cfg.trace == "synthetic":
        made_for = max(cfg.maxlen, CALIBRATED_MIN_MAXLEN)
        return generate_trajectories(made_for, cfg.num_agents, cfg.seed), made_for
    trajs = load_trace(cfg.trace, limit=cfg.num_agents)
    return trajs, max(t.final_len for t in trajs)


def _cap_turns(traj: Trajectory, max_turns: int | None) -> Trajectory:
    if max_turns is None or traj.num_turns <= max_turns:
        return traj
    return Trajectory(traj.traj_id, traj.turns[:max_turns], traj.arrival_s, traj.parent_id)


def _with_output_len(traj: Trajectory, output_len: int | None) -> Trajectory:
    if output_len is None:
        return traj
    turns = tuple(Turn(append_len=t.append_len, gen_len=output_len) for t in traj.turns)
    return Trajectory(traj.traj_id, turns, traj.arrival_s, traj.parent_id)


def build_agents(cfg: BenchConfig, context_len: int) -> list[Agent]:
    """Agents fitted to ``context_len``: synthetic ones scaled to ``min(maxlen, context_len)``
    (or by ``length_scale``), traces to ``context_len`` (when smaller than what they were made for), then truncated so no
    turn's context exceeds it. ``output_len`` replaces every turn's generation length (unscaled).
    Agents start at ``arrival_times_s`` of ``request_rate`` (all at 0 when inf)."""
    trajs, made_for = load_trajectories(cfg)
    target = min(context_len, cfg.maxlen) if cfg.trace == "synthetic" else context_len
    scale = cfg.length_scale if cfg.length_scale is not None else min(1.0, target / made_for)
    trajs = [_with_output_len(t, cfg.output_len) for t in trajs]
    replay = ReplayConfig(
        num_agents=cfg.num_agents,
        seed=cfg.seed,
        append_scale=scale,
        gen_scale=1.0 if cfg.output_len is not None else scale,
        max_len=max(2, target),
        synthetic_prefix_len=min(64, max(1, target // 8)),
    )
    starts = arrival_times_s(cfg.num_agents, cfg.request_rate, cfg.burstiness, cfg.seed)
    agents = []
    for i, (traj, start) in enumerate(zip(expand_agents(trajs, replay), starts)):
        traj = _cap_turns(traj, cfg.max_turns)
        agents.append(
            Agent(index=i, agent_id=traj.traj_id, start_s=start, turns=tuple(iter_turn_requests(traj)))
        )
    return agents


class TokenSource:
    """Deterministic random token ids of one agent (appends, and filler for text-only servers)."""

    def __init__(self, cfg: BenchConfig, agent_index: int, vocab_size: int) -> None:
        self._rng = np.random.default_rng([cfg.tokens_seed, 1000 + agent_index])
        self._lo = cfg.min_token_id
        self._hi = vocab_size

    def take(self, n: int) -> list[int]:
        return [int(t) for t in self._rng.integers(self._lo, self._hi, size=n)]

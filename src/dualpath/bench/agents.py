"""Agents to replay: trajectories scaled to the endpoint's context, start times, token ids.

Token content is deterministic per (seed, agent): turn ``i``'s prompt is the whole previous
context (prompt + generated tokens) followed by that turn's appended random ids, so a server with
a prefix cache sees exactly the reuse of the paper's agent workloads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dualpath.bench.config import BenchConfig
from dualpath.workload import (
    ReplayConfig,
    Trajectory,
    TurnRequest,
    expand_agents,
    generate_trajectories,
    iter_turn_requests,
    load_trace,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Agent:
    """One agent: its turns (lengths as the server should see them) and start time."""

    index: int
    agent_id: str
    start_s: float
    turns: tuple[TurnRequest, ...]


def load_trajectories(cfg: BenchConfig) -> tuple[list[Trajectory], int]:
    """(trajectories, the length they were made for: ``maxlen`` or the longest trajectory)."""
    if cfg.trace == "synthetic":
        return generate_trajectories(cfg.maxlen, cfg.num_agents, cfg.seed), cfg.maxlen
    trajs = load_trace(cfg.trace, limit=cfg.num_agents)
    return trajs, max(t.final_len for t in trajs)


def _cap_turns(traj: Trajectory, max_turns: int | None) -> Trajectory:
    if max_turns is None or traj.num_turns <= max_turns:
        return traj
    return Trajectory(traj.traj_id, traj.turns[:max_turns], traj.arrival_s, traj.parent_id)


def start_times_s(cfg: BenchConfig) -> list[float]:
    """0 for every agent offline; Poisson arrivals at ``aps`` agents/s online (seeded)."""
    if cfg.aps is None:
        return [0.0] * cfg.num_agents
    rng = np.random.default_rng([cfg.seed, 7])
    gaps = rng.exponential(1.0 / cfg.aps, size=cfg.num_agents)
    gaps[0] = 0.0
    return [float(t) for t in np.cumsum(gaps)]


def build_agents(cfg: BenchConfig, context_len: int) -> list[Agent]:
    """Agents fitted to ``context_len``: lengths scaled by ``context_len / made_for`` when smaller,
    then truncated so no turn's context exceeds ``context_len``."""
    trajs, made_for = load_trajectories(cfg)
    scale = min(1.0, context_len / made_for)
    replay = ReplayConfig(num_agents=cfg.num_agents, seed=cfg.seed, append_scale=scale,
                          gen_scale=scale, max_len=context_len,
                          synthetic_prefix_len=min(64, max(1, context_len // 8)))
    agents = []
    for i, (traj, start) in enumerate(zip(expand_agents(trajs, replay), start_times_s(cfg))):
        traj = _cap_turns(traj, cfg.max_turns)
        agents.append(Agent(index=i, agent_id=traj.traj_id, start_s=start,
                            turns=tuple(iter_turn_requests(traj))))
    return agents


class TokenSource:
    """Deterministic random token ids of one agent (appends, and filler for text-only servers)."""

    def __init__(self, cfg: BenchConfig, agent_index: int, vocab_size: int) -> None:
        self._rng = np.random.default_rng([cfg.seed, 1000 + agent_index])
        self._lo = cfg.min_token_id
        self._hi = vocab_size

    def take(self, n: int) -> list[int]:
        return [int(t) for t in self._rng.integers(self._lo, self._hi, size=n)]

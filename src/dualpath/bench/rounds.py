"""Agents driven round by round, to compare systems on one server with their rounds interleaved.

Round ``k`` sends turn ``k`` of every agent that has one (and whose earlier turns succeeded), all
at once, and ends when the last of them ends. ``RoundRun`` holds one system's agents across rounds
(their contexts grow turn by turn exactly as in ``run_bench``), so ``dualpath demo`` can run round
``k`` of each system in turn, then round ``k + 1``: a load change during the demo then falls on
every system alike instead of on whichever ran last. A system's JCT is the sum of its rounds' wall
times (each round starts all its agents together), an agent's JCT the sum of the rounds of its
turns.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime

import httpx

from dualpath.bench.agents import Agent, TokenSource, build_agents
from dualpath.bench.config import BenchConfig
from dualpath.bench.runner import BenchRun, Sender, agent_turn, discover
from dualpath.core.errors import ConfigError


@dataclass(slots=True)
class _AgentState:
    agent: Agent
    tokens: TokenSource
    context: list[int] = field(default_factory=list)
    failed: bool = False


class RoundRun:
    """One system's agents (``cfg``, an agents dataset) advanced a round at a time over ``http``."""

    def __init__(self, cfg: BenchConfig) -> None:
        if cfg.dataset_name != "agents":
            raise ConfigError("dataset_name", cfg.dataset_name, "rounds need the agents dataset")
        self.cfg = cfg
        self.run: BenchRun | None = None
        self._agents: list[_AgentState] = []
        self.round_s: list[float] = []  # wall time of each round run so far

    async def open(self, http: httpx.AsyncClient) -> BenchRun:
        endpoint = await discover(http, self.cfg)
        run = BenchRun(config=self.cfg, endpoint=endpoint, date=datetime.now().strftime("%Y%m%d-%H%M%S"))
        run.agents = build_agents(self.cfg, endpoint.max_context_len)
        self._agents = [
            _AgentState(a, TokenSource(self.cfg, a.index, endpoint.vocab_size)) for a in run.agents
        ]
        run.jct_s = dict.fromkeys((a.index for a in run.agents), None)
        self.run = run
        return run

    @property
    def num_rounds(self) -> int:
        return max((len(s.agent.turns) for s in self._agents), default=0)

    async def round(self, k: int, http: httpx.AsyncClient) -> float:
        """Run turn ``k`` of every live agent that has one; its wall time (0 if none had one)."""
        run = self.run
        assert run is not None, "open() first"
        live = [s for s in self._agents if not s.failed and k < len(s.agent.turns)]
        if not live:
            return 0.0
        t0 = time.perf_counter()
        sender = Sender(run, http, t0, None)
        ok = await asyncio.gather(
            *(agent_turn(sender, s.agent, s.agent.turns[k], s.tokens, s.context) for s in live)
        )
        wall = time.perf_counter() - t0
        self.round_s.append(wall)
        run.wall_s += wall
        for s, good in zip(live, ok, strict=True):
            s.failed = not good
            if s.failed:
                run.jct_s[s.agent.index] = None
            elif k == len(s.agent.turns) - 1:
                run.jct_s[s.agent.index] = sum(self.round_s)
        return wall

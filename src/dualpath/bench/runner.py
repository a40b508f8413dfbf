"""Run the benchmark: discover the endpoint, replay every agent concurrently, collect results.

Each agent issues its turns in order (turn ``i+1`` after turn ``i`` finished); agents run
concurrently from their start times. The run is bounded by ``duration_s``: agents still running
then are cancelled and reported as unfinished.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from dualpath.bench.agents import Agent, TokenSource, build_agents
from dualpath.bench.client import TurnResult, stream_completion
from dualpath.bench.config import BenchConfig
from dualpath.core.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    model: str
    max_context_len: int
    vocab_size: int


@dataclass(slots=True, kw_only=True)
class BenchRun:
    """Everything measured: per request, per agent (JCT; None if unfinished), wall time."""

    config: BenchConfig
    endpoint: Endpoint
    agents: list[Agent]
    results: list[TurnResult] = field(default_factory=list)
    jct_s: dict[int, float | None] = field(default_factory=dict)
    exact_token_ids: bool = True
    wall_s: float = 0.0


async def discover(http: httpx.AsyncClient, cfg: BenchConfig) -> Endpoint:
    """Model name, context length and vocab from /v1/models (vLLM and ours report the first two)."""
    try:
        resp = await http.get(cfg.url + "/v1/models")
    except httpx.HTTPError as exc:
        raise ConfigError("url", cfg.url, f"cannot reach the server: {exc}") from None
    if resp.status_code != 200:
        raise ConfigError("url", cfg.url, f"GET /v1/models answered {resp.status_code}: {resp.text[:200]}")
    data = resp.json().get("data") or [{}]
    entry = next((m for m in data if m.get("id") == cfg.model), data[0])
    model = cfg.model or entry.get("id")
    if not model:
        raise ConfigError("model", cfg.model, "the server lists no model; pass --model")
    ctx = cfg.max_context_len or entry.get("max_model_len") or cfg.maxlen
    vocab = cfg.vocab_size or entry.get("vocab_size") or 1000
    return Endpoint(model=model, max_context_len=int(ctx), vocab_size=int(vocab))


async def _run_agent(run: BenchRun, http: httpx.AsyncClient, agent: Agent, t0: float,
                     on_turn: Callable[[TurnResult], None] | None) -> None:
    cfg = run.config
    await asyncio.sleep(max(0.0, agent.start_s - (time.perf_counter() - t0)))
    started = time.perf_counter()
    tokens = TokenSource(cfg, agent.index, run.endpoint.vocab_size)
    context: list[int] = []
    run.jct_s[agent.index] = None
    for turn in agent.turns:
        context.extend(tokens.take(turn.append_len))
        res = TurnResult(agent_index=agent.index, turn_index=turn.turn_index,
                         prompt_len=len(context), gen_len=turn.gen_len)
        run.results.append(res)
        try:
            await stream_completion(http, cfg.url, run.endpoint.model, list(context), res,
                                    cfg.max_retries_429, t0)
        except asyncio.CancelledError:
            res.error = f"cancelled at the duration limit ({cfg.duration_s} s)"
            raise
        if on_turn is not None:
            on_turn(res)
        if res.error is not None:
            return
        if res.token_ids is not None and len(res.token_ids) == turn.gen_len:
            context.extend(res.token_ids)
        else:  # text-only server (or a short answer): filler ids keep the lengths right
            run.exact_token_ids = False
            context.extend(tokens.take(turn.gen_len))
    run.jct_s[agent.index] = time.perf_counter() - started


async def run_bench(cfg: BenchConfig, on_turn: Callable[[TurnResult], None] | None = None,
                    on_start: Callable[[BenchRun], None] | None = None) -> BenchRun:
    """Replay the agents of ``cfg`` against ``cfg.url``; never raises for a failed request."""
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=cfg.num_agents + 4, max_keepalive_connections=cfg.num_agents)
    timeout = httpx.Timeout(cfg.request_timeout_s, connect=10.0)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout) as http:
        endpoint = await discover(http, cfg)
        run = BenchRun(config=cfg, endpoint=endpoint,
                       agents=build_agents(cfg, endpoint.max_context_len))
        if on_start is not None:
            on_start(run)
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(_run_agent(run, http, a, t0, on_turn)) for a in run.agents]
        done, pending = await asyncio.wait(tasks, timeout=cfg.duration_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        run.wall_s = time.perf_counter() - t0
    return run


def total_turns(run: BenchRun) -> int:
    return sum(len(a.turns) for a in run.agents)


def describe(run: BenchRun) -> dict[str, Any]:
    return {"url": run.config.url, "model": run.endpoint.model, "mode": run.config.mode,
            "num_agents": run.config.num_agents, "max_context_len": run.endpoint.max_context_len}

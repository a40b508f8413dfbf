"""Run the benchmark: discover the endpoint, send every agent's turns or every request, collect.

Agents: each issues its turns in order (turn ``i+1`` after turn ``i`` finished); agents run
concurrently from their start times. Request datasets: each request is sent at its arrival time.
``max_concurrency`` caps requests in flight (a request waits for a slot, as in vLLM). The run is
bounded by ``duration_s``: whatever is still running then is cancelled and counted as failed
(requests never sent too). The server's cache counters are read before and after.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from dualpath.bench.agents import Agent, TokenSource, build_agents
from dualpath.bench.client import TurnResult, stream_completion
from dualpath.bench.config import BenchConfig
from dualpath.bench.datasets import PromptBuilder, RequestSpec, mooncake_requests, random_requests
from dualpath.bench.server_metrics import CacheHits, cache_hits, scrape
from dualpath.core.errors import ConfigError
from dualpath.workload import TurnRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    model: str
    max_context_len: int
    vocab_size: int


@dataclass(slots=True, kw_only=True)
class BenchRun:
    """Everything measured: per request, per agent (JCT; None if unfinished), wall time, the
    server's cache counters over the run (None: not reported)."""

    config: BenchConfig
    endpoint: Endpoint
    agents: list[Agent] = field(default_factory=list)
    requests: list[RequestSpec] = field(default_factory=list)
    results: list[TurnResult] = field(default_factory=list)
    jct_s: dict[int, float | None] = field(default_factory=dict)
    exact_token_ids: bool = True
    wall_s: float = 0.0
    cache: CacheHits | None = None
    date: str = ""


async def discover(http: httpx.AsyncClient, cfg: BenchConfig) -> Endpoint:
    """Model name, context length and vocab from /v1/models (vLLM and ours report the first two)."""
    try:
        resp = await http.get(cfg.url + "/v1/models", timeout=30.0)
    except httpx.HTTPError as exc:
        raise ConfigError("base_url", cfg.url, f"cannot reach the server: {exc}") from None
    if resp.status_code != 200:
        raise ConfigError(
            "base_url", cfg.url, f"GET /v1/models answered {resp.status_code}: {resp.text[:200]}"
        )
    data = resp.json().get("data") or [{}]
    entry = next((m for m in data if m.get("id") == cfg.model), data[0])
    model = cfg.model or entry.get("id")
    if not model:
        raise ConfigError("model", cfg.model, "the server lists no model; pass --model")
    ctx = cfg.max_context_len or entry.get("max_model_len") or cfg.maxlen
    vocab = cfg.vocab_size or entry.get("vocab_size") or 1000
    return Endpoint(model=model, max_context_len=int(ctx), vocab_size=int(vocab))


class Sender:
    """Sends one request under the concurrency cap; records cancellation as the failure reason."""

    def __init__(
        self, run: BenchRun, http: httpx.AsyncClient, t0: float, on_turn: Callable[[TurnResult], None] | None
    ) -> None:
        cfg = run.config
        self.run, self.http, self.t0, self.on_turn = run, http, t0, on_turn
        self.slots = (
            asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else contextlib.nullcontext()
        )

    async def send(self, res: TurnResult, prompt_ids: list[int]) -> None:
        cfg = self.run.config
        try:
            async with self.slots:
                await stream_completion(
                    self.http,
                    cfg.url,
                    self.run.endpoint.model,
                    prompt_ids,
                    res,
                    cfg.max_retries_429,
                    self.t0,
                    cfg.request_timeout_s,
                )
        except asyncio.CancelledError:
            res.error = f"cancelled at the duration limit ({cfg.duration_s:g} s)"
            raise
        if self.on_turn is not None:
            self.on_turn(res)


async def _sleep_until(t0: float, at_s: float) -> None:
    await asyncio.sleep(max(0.0, at_s - (time.perf_counter() - t0)))


async def _run_agent(sender: Sender, agent: Agent) -> None:
    run = sender.run
    await _sleep_until(sender.t0, agent.start_s)
    started = time.perf_counter()
    tokens = TokenSource(run.config, agent.index, run.endpoint.vocab_size)
    context: list[int] = []
    run.jct_s[agent.index] = None
    for turn in agent.turns:
        if not await agent_turn(sender, agent, turn, tokens, context):
            return
    run.jct_s[agent.index] = time.perf_counter() - started


async def agent_turn(
    sender: Sender, agent: Agent, turn: TurnRequest, tokens: TokenSource, context: list[int]
) -> bool:
    """Send one turn of ``agent`` (its appended ids join ``context``, then its answer's); False
    if it failed (the agent stops)."""
    run = sender.run
    context.extend(tokens.take(turn.append_len))
    res = TurnResult(
        agent_index=agent.index, turn_index=turn.turn_index, prompt_len=len(context), gen_len=turn.gen_len
    )
    run.results.append(res)
    await sender.send(res, list(context))
    if res.error is not None:
        return False
    if res.token_ids is not None and len(res.token_ids) == turn.gen_len:
        context.extend(res.token_ids)
    else:  # text-only server (or a short answer): filler ids keep the lengths right
        run.exact_token_ids = False
        context.extend(tokens.take(turn.gen_len))
    return True


async def _run_request(sender: Sender, spec: RequestSpec, res: TurnResult, prompts: PromptBuilder) -> None:
    try:
        await _sleep_until(sender.t0, spec.arrival_s)
    except asyncio.CancelledError:
        res.error = f"not sent before the duration limit ({sender.run.config.duration_s:g} s)"
        raise
    await sender.send(res, prompts.prompt(spec))


def _plan(run: BenchRun) -> None:
    cfg, ctx = run.config, run.endpoint.max_context_len
    if cfg.dataset_name == "agents":
        run.agents = build_agents(cfg, ctx)
        return
    run.requests = (
        mooncake_requests(cfg, ctx) if cfg.dataset_name == "mooncake" else random_requests(cfg, ctx)
    )
    run.results = [
        TurnResult(agent_index=None, turn_index=s.index, prompt_len=s.input_len, gen_len=s.output_len)
        for s in run.requests
    ]


async def run_bench(
    cfg: BenchConfig,
    on_turn: Callable[[TurnResult], None] | None = None,
    on_start: Callable[[BenchRun], None] | None = None,
) -> BenchRun:
    """Replay ``cfg`` against ``cfg.url``; never raises for a failed request (ConfigError when
    the server cannot be reached or the dataset is bad)."""
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    # like vLLM's connector: as many connections as requests in flight (no cap without one), so
    # no request waits in the client's pool after its send time was taken
    limits = httpx.Limits(
        max_connections=cfg.max_concurrency, max_keepalive_connections=cfg.max_concurrency or 256
    )
    timeout = httpx.Timeout(None, connect=10.0)  # per request: cfg.request_timeout_s
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout) as http:
        endpoint = await discover(http, cfg)
        run = BenchRun(config=cfg, endpoint=endpoint, date=datetime.now().strftime("%Y%m%d-%H%M%S"))
        _plan(run)
        if on_start is not None:
            on_start(run)
        before = await scrape(http, cfg.url)
        t0 = time.perf_counter()
        sender = Sender(run, http, t0, on_turn)
        if run.agents:
            coros: list[Any] = [_run_agent(sender, a) for a in run.agents]
        else:
            prompts = PromptBuilder(cfg, endpoint.vocab_size)
            coros = [_run_request(sender, s, r, prompts) for s, r in zip(run.requests, run.results)]
        tasks = [asyncio.create_task(c) for c in coros]
        done, pending = await asyncio.wait(tasks, timeout=cfg.duration_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        run.wall_s = time.perf_counter() - t0
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        run.cache = cache_hits(before, await scrape(http, cfg.url))
    return run


def total_requests(run: BenchRun) -> int:
    return sum(len(a.turns) for a in run.agents) if run.agents else len(run.requests)

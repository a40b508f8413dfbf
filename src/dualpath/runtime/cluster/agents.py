"""Agent replay against a cluster through ClusterClient (used by ``dualpath demo`` and the
throughput benchmark): every agent runs its turns back to back (offline JCT, zero tool latency);
turn i+1's prompt is turn i's prompt + generated tokens + a fresh append (spec section 9). The
turns come from the caller (``dualpath.bench.agents.scaled_turns``): runtime never imports workload."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from dualpath.runtime.cluster.api import MetricsSnapshot, SamplingParams
from dualpath.runtime.cluster.client import ClusterClient


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentPlan:
    """One agent's turns as (append_len, gen_len) pairs."""

    agent_id: str
    turns: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayResult:
    jct_s: float
    ttft_s: tuple[float, ...]
    num_requests: int
    hit_tokens: int
    prompt_tokens: int
    read_sides: dict[str, int]
    errors: tuple[str, ...]


async def replay(
    client: ClusterClient, agents: list[AgentPlan], *, vocab_size: int, seed: int
) -> ReplayResult:
    """Run all agents concurrently; JCT is the time until the last agent's last turn ends."""
    ttfts: list[float] = []
    sides: dict[str, int] = {}
    errors: list[str] = []
    hits = prompts = 0

    async def agent(plan: AgentPlan, index: int) -> None:
        nonlocal hits, prompts
        rng = random.Random(seed * 1_000_003 + index)
        context: list[int] = []
        for append_len, gen_len in plan.turns:
            context = context + [rng.randrange(3, vocab_size) for _ in range(append_len)]
            params = SamplingParams(max_tokens=gen_len, ignore_eos=True)
            async for ev in client.generate(context, params):
                if ev.finish_reason == "error":
                    errors.append(ev.error or "error")
                    return
                context.append(ev.token_id)
                if ev.stats is not None:
                    ttfts.append(ev.stats.ttft_s)
                    sides[ev.stats.read_side] = sides.get(ev.stats.read_side, 0) + 1
                    hits += ev.stats.hit_len
                    prompts += ev.stats.prompt_len

    t0 = time.monotonic()
    await asyncio.gather(*(agent(p, i) for i, p in enumerate(agents)))
    return ReplayResult(
        jct_s=time.monotonic() - t0,
        ttft_s=tuple(ttfts),
        num_requests=len(ttfts),
        hit_tokens=hits,
        prompt_tokens=prompts,
        read_sides=sides,
        errors=tuple(errors),
    )


async def closed_loop(
    client: ClusterClient,
    agents: list[AgentPlan],
    *,
    vocab_size: int,
    seed: int,
    warmup_s: float,
    window_s: float,
) -> dict[str, float]:
    """Steady-state throughput: every agent repeats its trajectory (fresh tokens each time) until
    ``warmup_s + window_s``; counts tokens and requests that finish inside the window.

    Returns generated tokens/s, requests/s and the mean TTFT inside the window."""
    t0 = time.monotonic()
    start, end = t0 + warmup_s, t0 + warmup_s + window_s
    done = {"tokens": 0, "requests": 0, "ttft_sum": 0.0}

    async def agent(plan: AgentPlan, index: int) -> None:
        rng = random.Random(seed * 1_000_003 + index)
        while time.monotonic() < end:
            context: list[int] = []
            for append_len, gen_len in plan.turns:
                if time.monotonic() >= end:
                    return
                context = context + [rng.randrange(3, vocab_size) for _ in range(append_len)]
                params = SamplingParams(max_tokens=gen_len, ignore_eos=True)
                async for ev in client.generate(context, params):
                    context.append(ev.token_id)
                    if ev.stats is not None and start <= time.monotonic() < end:
                        done["tokens"] += ev.stats.num_generated
                        done["requests"] += 1
                        done["ttft_sum"] += ev.stats.ttft_s

    await asyncio.gather(*(agent(p, i) for i, p in enumerate(agents)))
    n = max(done["requests"], 1)
    return {
        "tokens_per_s": done["tokens"] / window_s,
        "requests_per_s": done["requests"] / window_s,
        "ttft_mean_s": done["ttft_sum"] / n,
    }


def metrics_delta(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, dict[str, int]]:
    """Bytes per path and per NIC moved between two snapshots."""

    def diff(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        return {k: b.get(k, 0) - a.get(k, 0) for k in sorted(set(a) | set(b))}

    return {
        "bytes_by_path": diff(before.bytes_by_path, after.bytes_by_path),
        "bytes_by_nic": diff(before.bytes_by_nic, after.bytes_by_nic),
    }


async def run_system(
    client: ClusterClient,
    agents: list[AgentPlan],
    *,
    policy: str,
    read_free: bool,
    seed: int,
    settle_s: float,
    snic_gbps: float | None = None,
) -> dict[str, object]:
    """Configure the cluster for one system, replay the agents, return its row of results."""
    await client.configure(policy, read_free=read_free, snic_gbps=snic_gbps)
    info = await client.info()
    await asyncio.sleep(settle_s)
    before = await client.metrics()
    res = await replay(client, agents, vocab_size=info.vocab_size, seed=seed)
    await asyncio.sleep(settle_s)  # let the engines' last heartbeats (byte counters) arrive
    delta = metrics_delta(before, await client.metrics())
    ttft = sorted(res.ttft_s)
    snic_reads = {k.split("/")[0]: v for k, v in delta["bytes_by_nic"].items() if k.endswith(":read")}
    return {
        "jct_s": res.jct_s,
        "ttft_mean_s": sum(ttft) / len(ttft) if ttft else None,
        "ttft_p90_s": ttft[int(0.9 * (len(ttft) - 1))] if ttft else None,
        "num_requests": res.num_requests,
        "hit_rate": res.hit_tokens / res.prompt_tokens if res.prompt_tokens else 0.0,
        "read_sides": res.read_sides,
        "snic_read_bytes": snic_reads,
        "bytes_by_path": delta["bytes_by_path"],
        "generated_tokens": sum(g for a in agents for _, g in a.turns),
        "errors": list(res.errors),
    }

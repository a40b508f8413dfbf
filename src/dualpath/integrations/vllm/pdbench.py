"""The agents' workload on vLLM P/D (cluster.py): Basic, DualPath and no-I/O on the same cluster.

``k`` conversations, each with its own long context, are first sent once (misses: the prefill
instance computes and saves them). Then ``rounds`` rounds; in each, every mode in turn sends the
``k`` conversations' next turns at once (modes interleaved, so a shared machine's load drift hits
each mode alike): each turn is its conversation's context plus a question of its own (so every
mode hits the same context blocks and none hits another mode's question). Modes switch the proxy,
not the instances: ``basic`` (policy "basic": every read on the PE side), ``dualpath`` (policy
"dualpath": read side from the nodes' read queues), ``split`` (policy "dualpath-split": each hit
cut between the PE and a DE so both sides finish together; not run by default) and ``no-io``
(policy "dualpath" with the storage-NIC caps lifted for the reads: the I/O-free bound). Per mode:
wall time, turns/s, prefill-phase and decode-phase times,
read sides chosen, and the per-path bytes from the node agents' ``/metrics``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from dualpath.core.errors import ConfigError, require
from dualpath.integrations.vllm.cluster import PDCluster
from dualpath.integrations.vllm.tokens import load_tokenizer

MODES: dict[str, tuple[str, bool]] = {"basic": ("basic", True), "dualpath": ("dualpath", True),
                                      "split": ("dualpath-split", True), "no-io": ("dualpath", False)}  # fmt: skip
DEFAULT_MODES = ("basic", "dualpath", "no-io")


def parse_modes(text: str, option: str = "--modes") -> list[str]:
    """Comma-separated modes; ConfigError naming ``option`` and the first unknown one."""
    chosen = [m.strip() for m in text.split(",") if m.strip()]
    for m in chosen:
        if m not in MODES:
            raise ConfigError(option, m, f"choices: {', '.join(MODES)}")
    return chosen


_TOPIC = ("The river city grew from a trading post where boats unloaded salt, grain and timber; "
          "its markets, bridges and guild halls were rebuilt after each flood. ")  # fmt: skip


async def _turns(url: str, loops: Sequence[Sequence[list[int]]], max_tokens: int,
                 progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Each of ``loops`` (one per agent) sends its prompts one after the other; all agents at once."""
    done: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=900.0) as client:

        async def agent(prompts: Sequence[list[int]]) -> None:
            for p in prompts:
                body = {"prompt": p, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
                r = await client.post(f"{url}/v1/completions", json=body)
                r.raise_for_status()
                done.append(r.json())
                if progress:
                    progress(f"{len(done)} turns done")

        await asyncio.gather(*(agent(p) for p in loops))
    return done


def _delta(after: dict[int, dict[str, float]], before: dict[int, dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for node, counters in after.items():
        for k, v in counters.items():
            out[k] = out.get(k, 0.0) + v - before.get(node, {}).get(k, 0.0)
    return out


def run(cluster: PDCluster, *, modes: Sequence[str] = DEFAULT_MODES, conversations: int = 6, rounds: int = 2,
        context_repeats: int = 20, max_tokens: int = 2, turns_per_round: int = 1,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run the workload; returns ``{"modes": {mode: result}, "contexts": [lengths]}``. In each round
    every agent runs ``turns_per_round`` turns back to back (a closed loop: its next turn goes when
    its last one answered, so one agent's reads overlap another's compute); a round ends when
    every agent's last turn answered (1: the round is one turn per agent, all at once)."""
    require(turns_per_round >= 1, "turns_per_round", turns_per_round, "must be >= 1")
    tokenize = load_tokenizer(cluster.config.model)
    url = cluster.url
    ctxs = [tokenize(f"Story {c}. " + _TOPIC * context_repeats) for c in range(conversations)]

    def configure(policy: str, snic: bool) -> None:
        httpx.post(f"{url}/configure", json={"policy": policy, "snic": snic}, timeout=30).raise_for_status()

    configure("basic", False)
    if progress:
        progress(f"warm-up: {conversations} contexts of {min(map(len, ctxs))}-{max(map(len, ctxs))} tokens")
    asyncio.run(_turns(url, [[c] for c in ctxs], 1))
    got: dict[str, dict[str, Any]] = {m: {"wall_s": 0.0, "answers": [], "bytes": {}} for m in modes}
    for r in range(rounds):  # modes interleaved round by round: a shared machine's drift hits each
        for mode in modes:
            policy, snic = MODES[mode]
            configure(policy, snic)
            before = cluster.metrics()
            prompts = [[ctx + tokenize(f" Question {mode} {r} {k}: what happened to story {c} next?")
                        for k in range(turns_per_round)] for c, ctx in enumerate(ctxs)]  # fmt: skip
            t0 = time.perf_counter()
            got[mode]["answers"] += asyncio.run(_turns(url, prompts, max_tokens))
            wall = time.perf_counter() - t0
            got[mode]["wall_s"] += wall
            for k, v in _delta(cluster.metrics(), before).items():
                got[mode]["bytes"][k] = got[mode]["bytes"].get(k, 0.0) + v
            if progress:
                progress(
                    f"round {r + 1}/{rounds} {mode}: {len(prompts) * turns_per_round} turns in {wall:.1f} s"
                )
    return {"modes": _summary(modes, got), "contexts": [len(c) for c in ctxs]}


def _summary(modes: Sequence[str], got: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per mode: its policy, throughput, median prefill / decode times, hits and read sides."""
    out: dict[str, Any] = {}
    for mode in modes:
        policy, snic = MODES[mode]
        info = [a["dualpath"] for a in got[mode]["answers"]]
        sides: dict[str, int] = {}
        for i in info:
            sides[i["read_side"]] = sides.get(i["read_side"], 0) + 1
        wall = got[mode]["wall_s"]
        out[mode] = {"policy": policy, "snic": snic, "wall_s": wall, "turns_per_s": len(info) / wall,
                     "prefill_s_median": statistics.median(i["prefill_s"] for i in info),
                     "decode_s_median": statistics.median(i["decode_s"] for i in info),
                     "hit_tokens_mean": statistics.mean(i["cached_len"] for i in info),
                     "prompt_tokens_mean": statistics.mean(i["prompt_len"] for i in info),
                     "read_sides": sides, "bytes": got[mode]["bytes"]}  # fmt: skip
    return out


def ratios(result: dict[str, Any]) -> dict[str, float]:
    """Throughput ratios (turns per second): DualPath and split reads over Basic and over no-I/O."""
    m = result["modes"]
    out = {}
    for mode in ("dualpath", "split"):
        for base, name in (("basic", "basic"), ("no-io", "noio")):
            if mode in m and base in m:
                out[f"{mode}_over_{name}"] = m[mode]["turns_per_s"] / m[base]["turns_per_s"]
    return out

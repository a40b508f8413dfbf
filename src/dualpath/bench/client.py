"""One streamed text completion against any OpenAI-compatible server, timed token by token.

Request: ``/v1/completions`` with the prompt as token ids, ``max_tokens = min_tokens = gen_len``
and ``ignore_eos`` (vLLM-style extra fields that force the generation length), greedy, streamed
with usage, and ``return_token_ids`` so the generated ids can be appended to the agent's context
exactly. A server that returns text only gets deterministic filler ids in their place (the
generated part of the next prompt then differs from what the server generated; see docs/bench.md).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(slots=True, kw_only=True)
class TurnResult:
    """One request as the client saw it. Times in seconds; ``sent_s`` since the run started."""

    agent_index: int
    turn_index: int
    prompt_len: int
    gen_len: int
    sent_s: float = 0.0
    token_times_s: list[float] = field(default_factory=list)  # since the request was sent
    token_ids: list[int] | None = None
    usage_completion_tokens: int | None = None
    num_429: int = 0
    error: str | None = None

    @property
    def num_generated(self) -> int:
        return self.usage_completion_tokens or len(self.token_times_s)

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] if self.token_times_s else None

    @property
    def ttst_s(self) -> float | None:
        return self.token_times_s[1] if len(self.token_times_s) > 1 else None

    @property
    def tpot_s(self) -> float | None:
        t = self.token_times_s
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None

    @property
    def e2e_s(self) -> float | None:
        return self.token_times_s[-1] if self.token_times_s else None


def request_body(model: str, prompt_ids: list[int], gen_len: int) -> dict[str, Any]:
    return {"model": model, "prompt": prompt_ids, "max_tokens": gen_len, "min_tokens": gen_len,
            "ignore_eos": True, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}


def _on_chunk(obj: dict[str, Any], res: TurnResult, t_s: float) -> None:
    if "error" in obj:
        err = obj["error"]
        res.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        return
    usage = obj.get("usage")
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        res.usage_completion_tokens = int(usage["completion_tokens"])
    for choice in obj.get("choices") or []:
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            if res.token_ids is None:
                res.token_ids = []
            res.token_ids.extend(int(t) for t in ids)  # in place: no copy of the ids so far
            new = len(ids)
        else:
            new = 1 if choice.get("text") else 0  # text-only servers: one token per chunk
        res.token_times_s.extend([t_s] * new)


async def _error_text(resp: httpx.Response) -> str:
    body = (await resp.aread()).decode(errors="replace")
    try:
        return f"HTTP {resp.status_code}: {json.loads(body)['error']['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {resp.status_code}: {body[:300]}"


async def stream_completion(http: httpx.AsyncClient, url: str, model: str, prompt_ids: list[int],
                            res: TurnResult, max_retries_429: int, t0: float) -> TurnResult:
    """Fill ``res`` from one streamed request (429s are retried with backoff, then an error)."""
    body = request_body(model, prompt_ids, res.gen_len)
    for attempt in range(max_retries_429 + 1):
        res.sent_s = time.perf_counter() - t0
        start = time.perf_counter()
        try:
            async with http.stream("POST", url + "/v1/completions", json=body) as resp:
                if resp.status_code == 429 and attempt < max_retries_429:
                    res.num_429 += 1
                    await resp.aread()
                    await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
                    continue
                if resp.status_code != 200:
                    res.error = await _error_text(resp)
                    return res
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    _on_chunk(json.loads(data), res, time.perf_counter() - start)
        except (httpx.HTTPError, ValueError) as exc:
            res.error = f"{type(exc).__name__}: {exc}"
        if res.error is None and res.num_generated == 0:
            res.error = "the server generated no tokens"
        return res
    return res

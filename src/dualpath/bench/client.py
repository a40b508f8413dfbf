"""One streamed text completion against any OpenAI-compatible server, timed token by token.

Request: ``/v1/completions`` with the prompt as token ids, ``max_tokens = min_tokens = gen_len``
and ``ignore_eos`` (vLLM-style extra fields that force the generation length), greedy, streamed
with usage, and ``return_token_ids`` so the generated ids can be appended to the agent's context
exactly. A server that returns text only gets deterministic filler ids in their place (the
generated part of the next prompt then differs from what the server generated; see docs/bench.md).
Each HTTP attempt is bounded by ``timeout_s`` (send to the end of the stream).
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
    """One request as the client saw it. Times in seconds; ``sent_s`` since the run started, the
    others since the request was sent. ``agent_index`` is None for request-by-request datasets."""

    agent_index: int | None
    turn_index: int
    prompt_len: int
    gen_len: int
    sent_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)  # one entry per generated token
    chunk_times_s: list[float] = field(default_factory=list)  # one per streamed chunk with tokens
    end_s: float | None = None  # the stream's end ([DONE] or close)
    token_ids: list[int] | None = None
    usage_completion_tokens: int | None = None
    num_429: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.token_times_s)

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
    def e2e_s(self) -> float | None:
        """End-to-end latency (vLLM's E2EL): from sending to the end of the stream."""
        if not self.token_times_s:
            return None
        return self.end_s if self.end_s is not None else self.token_times_s[-1]

    @property
    def tpot_s(self) -> float | None:
        """vLLM's TPOT: (E2EL - TTFT) / (output tokens - 1); None for one-token answers."""
        n, e2e, ttft = self.num_generated, self.e2e_s, self.ttft_s
        return (e2e - ttft) / (n - 1) if n > 1 and e2e is not None and ttft is not None else None

    @property
    def itls_s(self) -> list[float]:
        """Inter-token latencies as vLLM counts them: the gaps between streamed chunks."""
        t = self.chunk_times_s
        return [b - a for a, b in zip(t, t[1:])]


def request_body(model: str, prompt_ids: list[int], gen_len: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": gen_len,
        "min_tokens": gen_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }


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
        if new:
            res.token_times_s.extend([t_s] * new)
            res.chunk_times_s.append(t_s)


async def _error_text(resp: httpx.Response) -> str:
    body = (await resp.aread()).decode(errors="replace")
    try:
        return f"HTTP {resp.status_code}: {json.loads(body)['error']['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {resp.status_code}: {body[:300]}"


async def _attempt(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], res: TurnResult, start: float, retry_429: bool
) -> bool:
    """One HTTP request; True when it answered 429 and should be retried."""
    async with http.stream("POST", url + "/v1/completions", json=body) as resp:
        if resp.status_code == 429 and retry_429:
            await resp.aread()
            return True
        if resp.status_code != 200:
            res.error = await _error_text(resp)
            return False
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            _on_chunk(json.loads(data), res, time.perf_counter() - start)
    res.end_s = time.perf_counter() - start
    return False


async def stream_completion(
    http: httpx.AsyncClient,
    url: str,
    model: str,
    prompt_ids: list[int],
    res: TurnResult,
    max_retries_429: int,
    t0: float,
    timeout_s: float = 300.0,
) -> TurnResult:
    """Fill ``res`` from one streamed request (429s are retried with backoff, then an error)."""
    body = request_body(model, prompt_ids, res.gen_len)
    for attempt in range(max_retries_429 + 1):
        res.sent_s = time.perf_counter() - t0
        start = time.perf_counter()
        res.token_times_s.clear()
        res.chunk_times_s.clear()
        res.token_ids = None
        try:
            retry = await asyncio.wait_for(
                _attempt(http, url, body, res, start, attempt < max_retries_429), timeout_s
            )
        except TimeoutError:
            res.error = f"request timeout: no complete answer within {timeout_s:g} s (--request-timeout)"
            return res
        except (httpx.HTTPError, ValueError) as exc:
            res.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return res
        if retry:
            res.num_429 += 1
            await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
            continue
        if res.error is None and res.num_generated == 0:
            res.error = "the server generated no tokens"
        return res
    return res

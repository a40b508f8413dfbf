"""One request through the cluster: token events -> text pieces (detokenized, stop strings applied).

Used by both the streaming and the non-streaming endpoints. Refusals before the first token
(queue full, too long, unavailable) propagate as ``ClusterError`` from the first ``__anext__``, so
the endpoint can still answer with an HTTP status; later failures (an engine or the scheduler
lost, a ``ClusterError`` after the first token) arrive as a ``Piece`` with
``finish_reason == "error"``, so a stream always ends with an error event and ``[DONE]``. Leaving
early closes the cluster stream, which aborts the request in the cluster, with the reason the
cluster counts it by (``ClusterClient.end``): a stop string "stop" (finished), this server's token
timeout "failed", the HTTP client gone (the generator closed or cancelled from outside)
"cancelled".
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from dualpath.runtime.cluster.api import ClusterError, RequestStats
from dualpath.runtime.server.protocol import ApiRequest
from dualpath.runtime.server.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass(slots=True, kw_only=True)
class Piece:
    """Text produced by one token (maybe "" while a stop string or character is incomplete)."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    error: str | None = None
    stats: RequestStats | None = None


@dataclass(slots=True, kw_only=True)
class Timing:
    """Server-side times of one request (seconds since it arrived) and its token count."""

    start_s: float = field(default_factory=time.perf_counter)
    token_times_s: list[float] = field(default_factory=list)

    def mark(self) -> None:
        self.token_times_s.append(time.perf_counter() - self.start_s)


class _StopMatcher:
    """Holds back text that might be the start of a stop string."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.emitted = 0

    def feed(self, full_text: str, last: bool) -> tuple[str, bool]:
        """Return (text to emit now, whether a stop string ended the request)."""
        hits = [
            p for p in (full_text.find(s, max(0, self.emitted - self.hold)) for s in self.stops) if p >= 0
        ]
        if hits:
            out = full_text[self.emitted : min(hits)]
            self.emitted = len(full_text)
            return out, True
        end = len(full_text) if last else max(self.emitted, len(full_text) - self.hold)
        out = full_text[self.emitted : end]
        self.emitted = end
        return out, False


async def run_generation(
    client: Any, req: ApiRequest, tok: Tokenizer, timing: Timing, token_timeout_s: float
) -> AsyncIterator[Piece]:
    """Yield one Piece per token of ``req``; the last one has ``finish_reason`` set."""
    detok = IncrementalDetokenizer(tok, req.prompt_ids)
    matcher = _StopMatcher(req.stop)
    rid = uuid.uuid4().hex
    events = client.generate(req.prompt_ids, req.params, request_id=rid)
    started = False
    async with aclosing(events):
        while True:
            try:
                ev = await asyncio.wait_for(events.__anext__(), token_timeout_s)
            except ClusterError as exc:
                if not started:  # a refusal: the endpoint answers with its status
                    raise
                yield Piece(text="", token_ids=[], finish_reason="error", error=str(exc))
                return
            except StopAsyncIteration:
                yield Piece(
                    text="",
                    token_ids=[],
                    finish_reason="error",
                    error="the cluster ended the stream without a final token",
                )
                return
            except TimeoutError:
                client.end(rid, "failed")
                yield Piece(
                    text="",
                    token_ids=[],
                    finish_reason="error",
                    error=f"no token from the cluster within {token_timeout_s} s",
                )
                return
            if ev.finish_reason == "error":
                yield Piece(
                    text="",
                    token_ids=[],
                    finish_reason="error",
                    error=ev.error or "the cluster failed the request",
                    stats=ev.stats,
                )
                return
            started = True
            timing.mark()
            detok.add(ev.token_id)
            if ev.is_last:
                detok.flush()
            text, stopped = matcher.feed(detok.text, ev.is_last)
            if stopped:
                if not ev.is_last:
                    client.end(rid, "stop")
                yield Piece(text=text, token_ids=[ev.token_id], finish_reason="stop", stats=ev.stats)
                return
            yield Piece(text=text, token_ids=[ev.token_id], finish_reason=ev.finish_reason, stats=ev.stats)
            if ev.is_last:
                return

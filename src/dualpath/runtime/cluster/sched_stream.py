"""What the scheduler has streamed to each request's client, so that a token reaches the client
once, in order, from whichever engine has it first.

Token ``k`` of a request can come from two engines: the PE samples the first token of each
attempt (``Progress`` "prefill_done" with ``first_token``) and the DE sends it again with its
own tokens; an attempt that resumes after an engine's death starts at the number of tokens the
client already has. :class:`Streams` keeps per request the tokens forwarded so far (what a
resumed attempt's prompt is extended with) and events that arrived ahead of a gap, and hands
back, for each incoming event, the events now due to the client in index order. Duplicates
(an index already forwarded) are dropped. No I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dualpath.runtime.cluster.api import TokenEvent


@dataclass(slots=True)
class _Stream:
    tokens: list[int] = field(default_factory=list)  # forwarded to the client, in index order
    ahead: dict[int, TokenEvent] = field(default_factory=dict)  # arrived before an earlier index
    de_started: bool = False  # the current attempt's DE sent a token (it holds the request)
    base: int = 0  # index of the current attempt's first token (its PE samples it)


class Streams:
    """Per request id: forwarded tokens, events held for a gap, whether its DE started."""

    def __init__(self) -> None:
        self._s: dict[str, _Stream] = {}

    def open(self, rid: str, had: list[int] | None = None) -> None:
        """A new request; ``had``: tokens its client already has (resubmitted after a scheduler
        restart): the first attempt goes on after them."""
        tokens = list(had or ())
        self._s[rid] = _Stream(tokens=tokens, base=len(tokens))

    def close(self, rid: str) -> None:
        self._s.pop(rid, None)

    def tokens(self, rid: str) -> list[int]:
        """Tokens the client has (a copy)."""
        s = self._s.get(rid)
        return [] if s is None else list(s.tokens)

    def num_tokens(self, rid: str) -> int:
        s = self._s.get(rid)
        return 0 if s is None else len(s.tokens)

    def base(self, rid: str) -> int:
        """Index of the current attempt's first token: the tokens the client had when it began
        (the PE's token must be placed there, whatever the DE streamed meanwhile)."""
        s = self._s.get(rid)
        return 0 if s is None else s.base

    def de_started(self, rid: str) -> bool:
        s = self._s.get(rid)
        return s is not None and s.de_started

    def mark_de_started(self, rid: str) -> None:
        s = self._s.get(rid)
        if s is not None:
            s.de_started = True

    def new_attempt(self, rid: str) -> None:
        """The request starts again (after an engine's death) from the tokens the client has:
        events held for a gap belonged to the lost attempt."""
        s = self._s.get(rid)
        if s is not None:
            s.ahead.clear()
            s.de_started = False
            s.base = len(s.tokens)

    def accept(self, rid: str, ev: TokenEvent) -> list[TokenEvent]:
        """``ev`` arrived; the events due to the client now, in order (maybe none: a duplicate,
        or ``ev`` is ahead of a gap and held). Nothing follows a final event."""
        s = self._s.get(rid)
        if s is None:
            return []
        nxt = len(s.tokens)
        if ev.index < nxt:
            return []  # (the PE's first token, then the DE's copy of it; or a stale straggler)
        if ev.index > nxt:
            s.ahead[ev.index] = ev
            return []
        out = [ev]
        s.tokens.append(ev.token_id)
        while not out[-1].is_last and (held := s.ahead.pop(len(s.tokens), None)) is not None:
            out.append(held)
            s.tokens.append(held.token_id)
        return out

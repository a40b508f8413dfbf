"""A request of the simulated benchmark and the batch one engine iteration runs.

``Req`` counts what the scheduler has *scheduled* (``computed`` prompt tokens, ``generated``
output tokens) apart from what has come out of finished iterations (``emitted``), because an
overlapped scheduler plans the next iteration before the current one ends (latency/engine.py).
The first output token comes with the iteration that schedules the prompt's last token; a
request preempted under an on-demand KV pool (vLLM's recompute) re-prefills its prompt and the
tokens it has generated, and that prefill's iteration emits its next token.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Req:
    """One request of ``isl`` prompt tokens and ``osl`` output tokens; ``prompt`` is what it must
    prefill (``isl``, or after a preemption its prompt and the output so far)."""

    rid: int
    client: int
    isl: int
    osl: int
    arrival_s: float
    prompt: int = 0
    sent_s: float = -1.0  # when its client sent it (TTFT starts there); arrival_s by default
    computed: int = 0
    generated: int = 0
    emitted: int = 0
    first_token_s: float | None = None
    done_s: float | None = None
    kv: int = 0  # KV entries it holds once its scheduled iterations ran
    preemptions: int = 0
    first_scheduled_s: float | None = None
    stalled_s: float = 0.0  # time between its first and last token spent in iterations with prompt tokens

    def __post_init__(self) -> None:
        if not self.prompt:
            self.prompt = self.isl
        if self.sent_s < 0:
            self.sent_s = self.arrival_s

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prompt

    @property
    def remaining_decode(self) -> int:
        """Decode iterations still to schedule once the prompt is in (0: the last is scheduled)."""
        return self.osl - self.generated

    @property
    def scheduled_done(self) -> bool:
        """Every output token is scheduled (the request waits only for its iteration's end)."""
        return not self.prefilling and self.generated >= self.osl


@dataclass(slots=True)
class Batch:
    """What one iteration (or ``repeat`` identical decode iterations) runs.

    ``chunks``: (request, prompt tokens, completes its prompt); ``rows``: requests decoding one
    token each per iteration; ``extra``: finished requests riding the overlapped scheduler's
    extra step (computed, nothing emitted).
    """

    chunks: list[tuple[Req, int, bool]] = field(default_factory=list)
    rows: list[Req] = field(default_factory=list)
    extra: list[Req] = field(default_factory=list)
    repeat: int = 1
    kv_start: float = 0.0  # mean KV length of the decode rows in the first iteration

    @property
    def prompt_tokens(self) -> int:
        return sum(tok for _, tok, _ in self.chunks)

    @property
    def num_rows(self) -> int:
        return len(self.rows) + len(self.extra)

    @property
    def empty(self) -> bool:
        return not self.chunks and not self.rows and not self.extra

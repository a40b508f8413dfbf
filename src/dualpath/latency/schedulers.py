"""How each backend fills one iteration: its scheduler's rules as the measured engine runs them.

These model other engines' schedulers (to predict their benchmarks); they are not dualpath's own
decisions, which live in policy/. Each function reads the engine's queues and mutates them the way
the backend's scheduler does: it admits waiting requests, schedules tokens (``Req.computed``,
``Req.generated``, ``Req.kv`` count what is scheduled) and preempts, and returns the batch.

- ``vllm``: one token budget for everything; running requests first (a decode row takes one token,
  a partly prefilled prompt as much of its rest as fits), then waiting requests in arrival order,
  each taking ``min(its prompt, the budget left)`` (chunked), while fewer than ``max_num_seqs`` run
  (vllm/v1/core/sched/scheduler.py). KV blocks are allocated as tokens are scheduled; when a
  running request cannot get one, the most recently admitted request is preempted (its KV freed,
  to be recomputed: prompt and output so far) and goes back to the front of the queue.
- ``sglang``: a prefill batch whenever a prompt waits and can be admitted (the chunked request
  first, then waiting ones up to ``min(chunked_prefill_size, max_prefill_tokens)`` prompt tokens,
  a prompt that does not fit the rest is chunked), decoding paused; else one decode batch of every
  running request (scheduler.get_next_batch_to_run, PrefillAdder). When decode needs more KV than
  is free, the newest request is retracted (its KV freed, re-queued).
- ``trtllm``: the capacity scheduler admits waiting requests in order while their whole KV
  (prompt + output) can be reserved (GUARANTEED_NO_EVICT) and fewer than ``max_batch_size`` run;
  the micro-batch scheduler then takes every generation request (one token each) and context
  requests whole while they fit ``max_num_tokens`` (no chunking by default).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from dualpath.latency.defaults import SchedulerDefaults
from dualpath.latency.requests import Batch, Req


@dataclass(slots=True)
class Queues:
    """One attention rank's requests: ``running`` in admission order, ``waiting`` in arrival
    order (``visible`` of them may be scheduled now), and the KV pool in tokens."""

    kv_capacity: float
    running: list[Req] = field(default_factory=list)
    waiting: deque[Req] = field(default_factory=deque)
    kv_used: int = 0  # sum of the running requests' KV
    reserved: int = 0  # sum of their whole KV (prompt + output), for reserve_full admission

    def admit(self, req: Req) -> None:
        self.running.append(req)
        self.reserved += req.isl + req.osl

    def release(self, req: Req) -> None:
        """``req`` leaves (finished or preempted): its KV and reservation are freed."""
        self.running.remove(req)
        self.kv_used -= req.kv
        self.reserved -= req.isl + req.osl


def _schedule_chunk(q: Queues, batch: Batch, req: Req, tok: int) -> None:
    req.computed += tok
    req.kv += tok
    q.kv_used += tok
    completes = not req.prefilling
    if completes:
        req.generated += 1
    batch.chunks.append((req, tok, completes))


def _schedule_row(q: Queues, batch: Batch, req: Req) -> None:
    req.generated += 1
    req.kv += 1
    q.kv_used += 1
    batch.rows.append(req)


def _preempt(q: Queues, victim: Req) -> None:
    """Free ``victim``'s KV and queue it first, to recompute its prompt and output so far."""
    q.release(victim)
    victim.prompt = victim.isl + victim.generated
    victim.computed = 0
    victim.kv = 0
    victim.preemptions += 1
    q.waiting.appendleft(victim)


def _fits(q: Queues, d: SchedulerDefaults, req: Req, tok: int) -> bool:
    if len(q.running) >= d.max_running:
        return False
    if d.admission == "reserve_full":
        return q.reserved + req.isl + req.osl <= q.kv_capacity or not q.running
    return q.kv_used + tok <= q.kv_capacity or not q.running


def admit_ready(q: Queues, d: SchedulerDefaults, visible: int) -> int:
    """Admit, in order, visible waiting requests whose prompt is already computed (a decode
    worker's hand-offs: their KV arrived) while they fit; the batch rules then decode them.
    Returns how many of the visible ones are left."""
    while q.waiting and visible > 0 and not q.waiting[0].prefilling:
        req = q.waiting[0]
        if not _fits(q, d, req, req.kv):
            break
        q.waiting.popleft()
        q.admit(req)
        q.kv_used += req.kv
        visible -= 1
    return visible


def _admit_waiting(q: Queues, d: SchedulerDefaults, batch: Batch, budget: int, visible: int) -> int:
    """Admit visible waiting requests in order while they fit; returns the budget left."""
    taken = 0
    while q.waiting and taken < visible and budget > 0:
        req = q.waiting[0]
        need = req.prompt - req.computed
        if not d.chunked_prefill and need > budget and (batch.chunks or batch.rows):
            break
        tok = min(need, budget) if d.chunked_prefill else need
        if not _fits(q, d, req, tok):
            break
        q.waiting.popleft()
        taken += 1
        q.admit(req)
        _schedule_chunk(q, batch, req, tok)
        budget -= tok
    return budget


def _ensure_kv(q: Queues, need: int, req: Req) -> bool:
    """Preempt the newest running request until ``need`` more KV fits for ``req``; False when
    ``req`` itself was the newest and went (vLLM's running loop: ``self.running.pop()``). A
    request alone in the pool runs even if the pool is too small (the memory model is off)."""
    while q.kv_used + need > q.kv_capacity and len(q.running) > 1:
        victim = q.running[-1]
        _preempt(q, victim)
        if victim is req:
            return False
    return True


def form_vllm(q: Queues, d: SchedulerDefaults, extra: list[Req], visible: int) -> Batch:
    batch = Batch()
    budget = d.token_budget
    for req in list(q.running):
        if budget <= 0 or req not in q.running or req.scheduled_done:
            continue
        tok = min(req.prompt - req.computed, budget) if req.prefilling else 1
        if not _ensure_kv(q, tok, req):
            break
        if req.prefilling:
            _schedule_chunk(q, batch, req, tok)
        else:
            _schedule_row(q, batch, req)
        budget -= tok
    _admit_waiting(q, d, batch, budget, visible)
    return batch


def form_trtllm(q: Queues, d: SchedulerDefaults, extra: list[Req], visible: int) -> Batch:
    batch = Batch(extra=list(extra))
    budget = d.token_budget - len(batch.extra)
    for req in q.running:
        if not req.prefilling and not req.scheduled_done and budget > 0:
            _schedule_row(q, batch, req)
            budget -= 1
    blocked = False
    for req in q.running:
        need = req.prompt - req.computed
        if req.prefilling and (need <= budget or not (batch.chunks or batch.rows)):
            _schedule_chunk(q, batch, req, need)
            budget -= need
        elif req.prefilling:
            blocked = True  # an admitted prompt waits for room: later ones wait behind it
            break
    if not blocked:
        _admit_waiting(q, d, batch, budget, visible)
    return batch


def form_sglang(q: Queues, d: SchedulerDefaults, extra: list[Req], visible: int) -> Batch:
    prefill = Batch()
    budget = d.prefill_tokens
    for req in q.running:
        if req.prefilling and budget > 0:  # the chunked request continues first
            tok = min(req.prompt - req.computed, budget)
            _schedule_chunk(q, prefill, req, tok)
            budget -= tok
    _admit_waiting(q, d, prefill, budget, visible)
    if prefill.chunks:
        return prefill
    batch = Batch(extra=list(extra))
    decoding = [r for r in q.running if not r.prefilling and not r.scheduled_done]
    for req in decoding:
        if req in q.running and _ensure_kv(q, 1, req):
            _schedule_row(q, batch, req)
    return batch


FORMERS = {"vllm": form_vllm, "trtllm": form_trtllm, "sglang": form_sglang}


def form_batch(q: Queues, d: SchedulerDefaults, extra: list[Req], visible: int) -> Batch:
    """The next iteration's batch under ``d.backend``'s rules (mutates ``q`` and the requests).
    ``extra``: requests that just finished, riding the overlapped scheduler's extra step where the
    backend runs one; ``visible``: how many of the waiting requests the scheduler can see."""
    visible = admit_ready(q, d, visible)
    return FORMERS[d.backend](q, d, extra if d.extra_steps else [], visible)

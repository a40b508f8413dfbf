"""One attention rank of a serving engine, stepped iteration by iteration on the sim event kernel.

Each iteration's batch comes from the backend's scheduler rules (latency/schedulers.py) under its
version's defaults (latency/defaults.py) and lasts what cost/forward.py gives for its tokens
(latency/steps.py). At an iteration's end its tokens come out (the first token with the prompt's
last chunk), finished requests leave and their clients are told, and the next batch is formed.

**When a request is seen.** A request arriving at time ``t`` from a client that just got its last
token is not in the batch formed at that same instant (the scheduler does not wait for a client
round trip). Without an overlapped scheduler the next batch is formed when an iteration ends, so
the request waits for the iteration formed before it arrived: it sees batches formed after ``t``.
With one (vLLM async scheduling, SGLang's overlap scheduler, TensorRT-LLM's overlap scheduler) the
batch for iteration ``j`` is formed while ``j - 1`` runs, so a request is seen only by batches
formed after the iteration in progress at ``t`` began: it waits one iteration more. TensorRT-LLM
and SGLang also run the finished requests once more (their stop check comes after the next
iteration was launched, the "extra decoding step"); vLLM's async scheduler skips a request it
knows reaches ``max_tokens``. An idle engine takes whatever has arrived at once (requests that
arrive together are batched together).

**Fast-forward.** While the batch is decode-only and nothing can change before the soonest
request finishes (no request waiting that could be admitted, KV left for the growth), the
iterations up to that finish run as one event (``Batch.repeat``); a request that arrives in
between (disaggregated decode) cuts the block at the iteration that would have seen it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dualpath.latency.defaults import SchedulerDefaults
from dualpath.latency.requests import Batch, Req
from dualpath.latency.schedulers import Queues, form_batch
from dualpath.latency.steps import StepCost
from dualpath.sim.kernel import PRIO_ARRIVAL, PRIO_COMPLETE, Handle, Kernel

PRIO_KICK = PRIO_ARRIVAL + 1  # an idle engine starts after every request of the same instant


class Engine:
    """One attention rank (see the module doc). ``on_done(req)`` runs when ``req``'s last token
    is out; ``submit`` hands it a request. Counters: ``iterations``, ``busy_s``."""

    def __init__(
        self,
        kernel: Kernel,
        defaults: SchedulerDefaults,
        cost: StepCost,
        kv_capacity_tokens: float,
        on_done: Callable[[Req], None],
    ) -> None:
        self.kernel = kernel
        self.d = defaults
        self.cost = cost
        self.q = Queues(kv_capacity=kv_capacity_tokens)
        self.on_done = on_done
        self.current: Batch | None = None
        self._start_s = 0.0
        self._end: Handle | None = None
        self._kicked = False
        self._prev_boundary_s = 0.0
        self._finished: list[Req] = []
        self.iterations = 0
        self.busy_s = 0.0

    # ---- requests in ------------------------------------------------------------------------
    def submit(self, req: Req) -> None:
        self.q.waiting.append(req)
        if self.current is None:
            if not self._kicked:
                self._kicked = True
                self.kernel.call_at(self.kernel.now_s, self._kick, PRIO_KICK)
        elif self.current.repeat > 1:
            self._cut_block()

    def _kick(self) -> None:
        self._kicked = False
        if self.current is None:
            self._launch(visible_before_s=math.inf)

    # ---- iterations ---------------------------------------------------------------------------
    def _visible(self, before_s: float) -> int:
        return sum(1 for r in self.q.waiting if r.arrival_s < before_s)

    def _launch(self, visible_before_s: float) -> None:
        extra, self._finished = self._finished, []
        batch = form_batch(self.q, self.d, extra, self._visible(visible_before_s))
        if batch.empty and self.q.waiting:  # nothing seen yet: the loop runs again at once
            batch = form_batch(self.q, self.d, [], len(self.q.waiting))
        if batch.empty:
            self.current = None
            return
        now = self.kernel.now_s
        for req, _, _ in batch.chunks:
            if req.first_scheduled_s is None:
                req.first_scheduled_s = now
        self._fast_forward(batch)
        duration = self._duration(batch)
        self.current = batch
        self._start_s = self.kernel.now_s
        self._end = self.kernel.at(self._start_s + duration, self._iteration_end, PRIO_COMPLETE)

    def _duration(self, batch: Batch) -> float:
        rows = batch.rows + batch.extra
        kv = sum(r.kv for r in rows) / len(rows) if rows else 0.0
        batch.kv_start = kv
        if batch.repeat > 1:
            return self.cost.block_s(len(rows), kv, batch.repeat)
        return self.cost.mixed_s(batch.prompt_tokens, len(rows), kv)

    def _fast_forward(self, batch: Batch) -> None:
        if batch.chunks or batch.extra or not batch.rows:
            return
        if any(r.emitted == 0 for r in batch.rows):
            return  # a hand-off's first token comes with its first decode iteration
        if any(r.arrival_s >= self._prev_boundary_s for r in self.q.waiting):
            return  # a request not yet seen will be seen at the next boundary
        steps = min(r.osl - r.generated for r in batch.rows)
        if self.d.admission == "on_demand":
            free = self.q.kv_capacity - self.q.kv_used
            steps = min(steps, int(max(free, 0) // len(batch.rows)))
        if steps >= 1:
            for r in batch.rows:
                r.generated += steps
                r.kv += steps
            self.q.kv_used += steps * len(batch.rows)
            batch.repeat = 1 + steps

    def _cut_block(self) -> None:
        """A request arrived during a decode block: end the block at the iteration that would
        have seen it (the next boundary, one more under an overlapped scheduler)."""
        batch = self.current
        assert batch is not None and self._end is not None
        m = batch.repeat
        each = (self._end_time() - self._start_s) / m
        k = int((self.kernel.now_s - self._start_s) / each + 1e-9) + 1 + (1 if self.d.overlap else 0)
        if k >= m:
            return
        for r in batch.rows:
            r.generated -= m - k
            r.kv -= m - k
        self.q.kv_used -= (m - k) * len(batch.rows)
        batch.repeat = k
        self._end.cancel()
        end = self._start_s + self.cost.block_s(len(batch.rows), batch.kv_start, k)
        self._end = self.kernel.at(max(end, self.kernel.now_s), self._iteration_end, PRIO_COMPLETE)

    def _end_time(self) -> float:
        batch = self.current
        assert batch is not None
        return self._start_s + self.cost.block_s(len(batch.rows), batch.kv_start, batch.repeat)

    def _iteration_end(self) -> None:
        batch = self.current
        assert batch is not None
        now = self.kernel.now_s
        duration = now - self._start_s
        self.iterations += batch.repeat
        self.busy_s += duration
        self._prev_boundary_s = now - duration / batch.repeat
        if batch.chunks:
            for r in self.q.running:
                if r.emitted and r.first_token_s is not None:
                    r.stalled_s += duration
        done = self._emit(batch, now)
        self.current = None
        for r in done:
            self.q.release(r)
        self._finished = done if self.d.extra_steps else []
        before = self._prev_boundary_s if self.d.overlap else now
        self._launch(visible_before_s=before)
        for r in done:
            self.on_done(r)

    def _emit(self, batch: Batch, now: float) -> list[Req]:
        done: list[Req] = []
        for req, _, completes in batch.chunks:
            if completes:
                self._token(req, now, 1, done)
        for req in batch.rows:
            self._token(req, now, batch.repeat, done)
        return done

    @staticmethod
    def _token(req: Req, now: float, count: int, done: list[Req]) -> None:
        if req.first_token_s is None:
            req.first_token_s = now
        req.emitted += count
        if req.emitted >= req.osl:
            req.done_s = now
            done.append(req)

"""The decode side of the planner's run: continuous-batching steps summed in closed form.

One step advances every admitted, handed-over sequence by one token. Its time is the closed form
of the unit (pools.UnitTimer: stage rooflines, TP/EP collectives, AF round trips; no per-layer
events). Steps between two changes of the batch (a join, a completion, a prefill that preempts) are
summed in closed form as one event (``_cum``: the work is linear in the growing context between
grid points ``parallel.DECODE_CTX_GRID`` tokens apart, so each grid cell sums as a trapezoid); an
event that changes the batch cuts the segment at the end of the step in progress. A mixin of
run._Run (its state: ``batch``, ``ctx_sum``, ``step``, ``finish``, ``seg``, ...).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dualpath.planner.parallel import DECODE_CTX_GRID
from dualpath.planner.pools import IterTime
from dualpath.sim.kernel import PRIO_COMPLETE, Handle


@dataclass(slots=True)
class Segment:
    start_s: float
    step0: int
    steps: int
    batch: int
    ctx_sum: float
    handle: Handle
    sums: tuple[float, float, float] = (0.0, 0.0, 0.0)
    memo: dict[int, IterTime] = field(default_factory=dict)


class DecodeSegments:
    """Decode segments of run._Run (mixin; the attributes are _Run's)."""

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any: ...

    def _join_pending(self) -> None:
        """Move the handed-over sequences into the running batch at the current step."""
        for rid in self.pending:
            self.join_step[rid] = self.step
            self.batch += 1
            self.ctx_sum += self.reqs.input_len[rid] - self.step
            heapq.heappush(self.finish, (self.step + self.reqs.output_len[rid], rid))
        self.pending.clear()

    def _start_decode(self) -> None:
        self._join_pending()
        steps = self.finish[0][0] - self.step
        seg = Segment(
            start_s=self.k.now_s,
            step0=self.step,
            steps=steps,
            batch=self.batch,
            ctx_sum=self.ctx_sum,
            handle=None,
        )  # type: ignore[arg-type]
        seg.sums = self._cum(seg, steps)
        seg.handle = self.k.at(seg.start_s + seg.sums[0], self._end_decode, PRIO_COMPLETE)
        self.seg = seg
        self.busy_unit[self.dec.unit.name] = True

    def _step_time(self, seg: Segment, j: int) -> IterTime:
        it = seg.memo.get(j)
        if it is None:
            ctx = seg.ctx_sum / seg.batch + seg.step0 + j
            it = seg.memo[j] = self.dec.decode(seg.batch, ctx)
        return it

    def _cum(self, seg: Segment, n: int) -> tuple[float, float, float]:
        """Sums over the segment's first ``n`` steps, piece by piece between the context grid
        points where the step time's slope may change."""
        f: Callable[[int], IterTime] = lambda j: self._step_time(seg, j)  # noqa: E731
        m = seg.ctx_sum / seg.batch + seg.step0  # mean context at the segment's step 0
        g = DECODE_CTX_GRID
        out = (0.0, 0.0, 0.0)
        a = 0
        while a < n:
            nxt = (math.floor((m + a) / g) + 1) * g  # next grid point above the context at a
            b = min(n, max(a + 1, math.ceil(nxt - m - 1e-9)))
            x = _series(f, a, b - a)
            out = (out[0] + x[0], out[1] + x[1], out[2] + x[2])
            a = b
        return out

    def _cut(self) -> None:
        """End the running segment after the step in progress (a join or a prefill waits)."""
        seg = self.seg
        assert seg is not None
        elapsed = self.k.now_s - seg.start_s
        f: Callable[[int], IterTime] = lambda j: self._step_time(seg, j)  # noqa: E731
        # the smallest n whose n steps end at or after now (steps only grow: n <= the guess)
        lo, hi = 1, min(seg.steps, int(elapsed / f(0).time_s) + 1)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._cum(seg, mid)[0] >= elapsed - 1e-12:
                hi = mid
            else:
                lo = mid + 1
        n = lo
        if n >= seg.steps:
            return
        seg.handle.cancel()
        sums = self._cum(seg, n)
        seg.steps, seg.sums = n, sums
        seg.handle = self.k.at(seg.start_s + sums[0], self._end_decode, PRIO_COMPLETE)

    def _end_decode(self) -> None:
        seg = self.seg
        assert seg is not None
        self.seg = None
        it = IterTime(
            time_s=seg.sums[0], a_busy_s=seg.sums[1], f_busy_s=seg.sums[2], fwd_bytes=0.0, bwd_bytes=0.0
        )
        self._account(self.dec, it, seg.start_s, seg.steps, decode_tokens=seg.batch)
        self.step += seg.steps
        freed = self._complete()
        self.busy_unit[self.dec.unit.name] = False
        if freed:
            self._admit()
        if not self.busy_unit[self.dec.unit.name]:
            self._next(self.dec)

    def _complete(self) -> bool:
        """Retire every sequence whose last token the current step produced (frees its KV and
        slot); True when any did."""
        now = self.k.now_s
        freed = False
        while self.finish and self.finish[0][0] <= self.step:
            _, rid = heapq.heappop(self.finish)
            self.batch -= 1
            self.ctx_sum -= self.reqs.input_len[rid] - self.join_step[rid]
            self.kv_used -= self.kv_req[rid]
            self.num_admitted -= 1
            self.done_s[rid] = now
            self.num_done += 1
            freed = True
        if self.batch == 0:
            self.ctx_sum = 0.0
        return freed


def _series(f: Callable[[int], IterTime], a: int, n: int) -> tuple[float, float, float]:
    """(sum of time, A busy, F busy) of ``f(a) .. f(a + n - 1)`` over one grid cell, where the
    work is linear in the step: the trapezoid of the two ends (exact when the step time is linear;
    a compute/memory crossover inside the cell is smoothed)."""
    if n <= 0:
        return (0.0, 0.0, 0.0)
    first = f(a)
    if n == 1:
        return (first.time_s, first.a_busy_s, first.f_busy_s)
    last = f(a + n - 1)
    return (
        n * (first.time_s + last.time_s) / 2,
        n * (first.a_busy_s + last.a_busy_s) / 2,
        n * (first.f_busy_s + last.f_busy_s) / 2,
    )

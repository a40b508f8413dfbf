"""``--nd-schedule token-budget``: a unit hosting both phases (ND, AF) mixes decode and prefill.

Every iteration advances each running sequence by one token and prefills chunks of the waiting
prompts, FIFO, up to ``prefill_token_budget`` tokens per lane less the lane's decode tokens; a
prompt longer than what is left is chunked (one chunk of a prompt per iteration, its prefix kept),
and joins the batch when its last chunk is done. With no prompt waiting the unit runs the closed-
form decode segments (run_decode.py). A mixin of run._Run.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Any

from dualpath.planner.schedule import mixed_iteration
from dualpath.sim.kernel import PRIO_COMPLETE

Taken = list[list[tuple[int, int, int]]]  # per lane: (request, tokens done before, chunk tokens)


class MixedIterations:
    """Token-budget iterations of run._Run (mixin; the attributes are _Run's)."""

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any: ...

    def _take_chunks(self, lanes: int, room: int) -> Taken:
        """FIFO chunks of the waiting prompts, ``room`` tokens per lane, one chunk per prompt."""
        out: Taken = []
        q = list(self.prefill_q)
        i = 0
        for _ in range(lanes):
            left, lane = room, []
            while left > 0 and i < len(q):
                rid = q[i]
                done = self.prefilled.get(rid, 0)
                n = min(left, self.reqs.input_len[rid] - done)
                lane.append((rid, done, n))
                left -= n
                i += 1
            if not lane:
                break
            out.append(lane)
        return out

    def _start_mixed(self) -> None:
        self._join_pending()
        unit = self.dec
        b_lane = math.ceil(self.batch / unit.lanes) if self.batch else 0
        taken = self._take_chunks(unit.lanes, self.cfg.prefill_token_budget - b_lane)
        if not taken:  # the decode batch fills the budget: decode only
            self._start_decode()
            return
        ctx = self.ctx_sum / self.batch + self.step if self.batch else 0.0
        it = mixed_iteration(unit, [[(d, n) for _, d, n in lane] for lane in taken], self.batch, ctx)
        now = self.k.now_s
        self._account(unit, it, now, 1)
        self.busy_unit[unit.unit.name] = True
        decoded = self.batch > 0
        self.k.call_at(now + it.time_s, lambda: self._end_mixed(taken, decoded), PRIO_COMPLETE)

    def _end_mixed(self, taken: Taken, decoded: bool) -> None:
        finished = []
        for lane in taken:
            for rid, done, n in lane:
                if done + n >= self.reqs.input_len[rid]:
                    finished.append(rid)
                    self.prefilled.pop(rid, None)
                else:
                    self.prefilled[rid] = done + n
        if finished:
            gone = set(finished)
            self.prefill_q = deque(r for r in self.prefill_q if r not in gone)
        freed = False
        if decoded:
            self.step += 1
            freed = self._complete()
        self.pending.extend(finished)
        self.busy_unit[self.dec.unit.name] = False
        if freed:
            self._admit()
        if not self.busy_unit[self.dec.unit.name]:
            self._next(self.dec)

"""Seconds of one engine iteration of one attention rank, from cost/forward.py, memoised.

The simulation (latency/engine.py) asks for thousands of iterations per benchmark; a
``Forward.step`` costs about a millisecond, so the iterations are priced on a few exact points:

- decode-only iterations of ``rows`` requests (the CUDA-graph padding is Forward's) at the mean KV
  length of the rows, piecewise linear between three exact points ``isl``, ``isl + osl / 2`` and
  ``isl + osl`` (the span a request's KV covers; a row's decode attention grows linearly with its
  KV, and the middle point makes a one-request decode exact at its mean length);
- iterations that carry ``tok`` prompt tokens beside ``rows`` decode rows, priced as
  cost/prefill_packing.py ``prefill_step`` prices them (``tok / isl`` prompts of ``isl``, or one
  chunk of ``tok`` after ``(isl - tok) / 2`` cached tokens: the same GEMM tokens and attention
  pairs as a chunk at a uniform offset), at the middle KV length, plus the decode rows' change
  with their KV length taken from the decode points. Whole prompts (``tok`` a multiple of
  ``isl``) and up to 64 tokens are exact points; other ``tok`` interpolate linearly between
  points ``2^(1/8)`` apart, and ``rows`` between 0, 1, 2, 3, 4, 6, 8, 12, ... (a monotone
  interpolation of a monotone cost stays monotone).

``step_cost`` keeps one StepCost per (deployment, isl, osl) for the process, so the rows of a CSV
that differ only in concurrency share their points.

With ``pp > 1`` a token takes one pass over all stages of its micro-batch (``rows / pp``), plus
the stage-to-stage activation transfers (cost/latency.py ``_pp_s``), as the closed form prices it.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict

from dualpath.cost.forward import Forward, Step, StepTime
from dualpath.cost.latency import _pp_s
from dualpath.cost.prefill_packing import prefill_step

EXACT_TOKENS = 64
TOKEN_STEP = 2 ** (1 / 8)
ROW_POINTS = (0, 1, 2, 3, 4, 6, 8) + tuple(int(8 * 1.5 ** (i / 1)) for i in range(1, 24))
_CACHE: OrderedDict[tuple[object, ...], StepCost] = OrderedDict()
_CACHE_SIZE = 256


def step_cost(fw: Forward, isl: int, osl: int) -> StepCost:
    """The process-wide StepCost of ``fw`` for ``isl`` / ``osl`` (see the module doc)."""
    key = (id(fw.kernels), fw.model.name, fw.par, fw.prec, fw.backend, isl, osl)
    cost = _CACHE.get(key)
    if cost is None:
        cost = _CACHE[key] = StepCost(fw, isl, osl)
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return cost


def _bracket(points: tuple[int, ...], x: int) -> tuple[int, int]:
    i = bisect.bisect_left(points, x)
    if i < len(points) and points[i] == x:
        return x, x
    i = min(max(i, 1), len(points) - 1)
    return points[i - 1], points[i]


def _token_bracket(tok: int, isl: int) -> tuple[int, int]:
    if tok <= EXACT_TOKENS or tok % isl == 0:
        return tok, tok
    i = math.floor(math.log(tok / EXACT_TOKENS, TOKEN_STEP))
    lo = round(EXACT_TOKENS * TOKEN_STEP**i)
    hi = round(EXACT_TOKENS * TOKEN_STEP ** (i + 1))
    while lo > tok:
        i -= 1
        lo, hi = round(EXACT_TOKENS * TOKEN_STEP**i), lo
    while hi < tok:
        i += 1
        lo, hi = hi, round(EXACT_TOKENS * TOKEN_STEP ** (i + 1))
    return lo, hi


def _lerp(x: float, x0: float, x1: float, y0: float, y1: float) -> float:
    return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class StepCost:
    """Iteration times of ``fw`` for requests of ``isl`` prompt and ``osl`` output tokens.

    Reading only: the memo is this object's; every StepTime it computed is kept for the sources.
    """

    __slots__ = ("fw", "isl", "osl", "_decode", "_mixed", "steps")

    def __init__(self, fw: Forward, isl: int, osl: int) -> None:
        self.fw = fw
        self.isl = isl
        self.osl = osl
        self._decode: dict[tuple[int, int], float] = {}
        self._mixed: dict[tuple[int, int], float] = {}
        self.steps: list[StepTime] = []

    @property
    def _points(self) -> tuple[float, float, float]:
        return (float(self.isl), self.isl + self.osl / 2, float(self.isl + self.osl))

    def _run(self, step: Step, tokens: float) -> float:
        st = self.fw.step(step)
        self.steps.append(st)
        return st.time_s + _pp_s(self.fw, tokens)

    def _decode_at(self, rows: int, point: int) -> float:
        key = (rows, point)
        if key not in self._decode:
            per_stage = rows / self.fw.par.pp
            kv = self._points[point]
            self._decode[key] = self._run(Step(gen_requests=per_stage, kv_len=kv), per_stage)
        return self._decode[key]

    def decode_s(self, rows: int, kv_len: float) -> float:
        """One decode-only iteration of ``rows`` requests whose mean KV length is ``kv_len``."""
        if rows <= 0:
            return 0.0
        lo, mid, hi = self._points
        if self.osl <= 1 or hi <= lo:
            return self._decode_at(rows, 1)
        if kv_len <= mid:
            a, b, x0, x1 = 0, 1, lo, mid
        else:
            a, b, x0, x1 = 1, 2, mid, hi
        ta, tb = self._decode_at(rows, a), self._decode_at(rows, b)
        return ta + (tb - ta) * (kv_len - x0) / (x1 - x0)

    def _mixed_at(self, tok: int, rows: int) -> float:
        key = (tok, rows)
        if key not in self._mixed:
            pp = self.fw.par.pp
            mid = self._points[1]
            step = prefill_step(float(tok), self.isl, gen_requests=rows / pp, kv_len=mid)
            self._mixed[key] = self._run(step, tok + rows / pp)
        return self._mixed[key]

    def mixed_s(self, tok: int, rows: int, kv_len: float) -> float:
        """One iteration of ``tok`` prompt tokens and ``rows`` decode rows (``rows`` may be 0)."""
        if tok <= 0:
            return self.decode_s(rows, kv_len)
        t0, t1 = _token_bracket(tok, self.isl)
        r0, r1 = _bracket(ROW_POINTS, rows) if rows <= ROW_POINTS[-1] else (rows, rows)

        def at_rows(t: int) -> float:
            return _lerp(rows, r0, r1, self._mixed_at(t, r0), self._mixed_at(t, r1))

        base = _lerp(tok, t0, t1, at_rows(t0), at_rows(t1))
        if rows and self.osl > 1:
            base += self.decode_s(rows, kv_len) - self.decode_s(rows, self._points[1])
        return base

    def block_s(self, rows: int, kv_len: float, iterations: int) -> float:
        """``iterations`` consecutive decode-only iterations starting at mean KV ``kv_len`` (each
        adds one token to every row): exact for a piecewise-linear cost within one segment."""
        if iterations <= 0:
            return 0.0
        return iterations * self.decode_s(rows, kv_len + (iterations - 1) / 2)

"""How a pool hosting both phases (ND; AF's A and F pools) shares its lanes between them.

The paper says nothing about it ("our resolution of an ambiguity", docs/planner.md):

- ``prefill-first`` (default): a prefill iteration runs whenever prompts wait; decode waits.
- ``token-budget``: every iteration carries one decode token of each running sequence plus prefill
  chunks of the waiting prompts, FIFO, up to ``prefill_token_budget`` tokens per lane (long prompts
  are chunked), as chunked-prefill engines (vLLM, SGLang) do. A mixed iteration streams each
  stage's weights once for both phases (the roofline of the summed work: ``cost.stages.merge_works``;
  a later chunk attends to its prompt's prefix, ``stage_work(cached_len=...)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from dualpath.cost.stages import merge_works
from dualpath.planner.parallel import af_layer_s, cached_work
from dualpath.planner.pools import IterTime

if TYPE_CHECKING:
    from dualpath.planner.parallel import StageTimer
    from dualpath.planner.pools import PoolTimer, UnitTimer

ND_SCHEDULES: Final = ("prefill-first", "token-budget")
ND_SCHEDULE_DEFAULT: Final = "prefill-first"

Chunk = tuple[int, int]  # (tokens already prefilled, tokens in this chunk)


def _a_lane_s(
    timer: StageTimer, chunks: Sequence[Chunk], batch: int, context_len: float, da_bits: int
) -> float:
    """One lane's A stage over prefill chunks and a decode batch mixed: the weights stream once."""
    model = timer.model
    works = [cached_work(model, "pa", 1, n, timer.bits, done) for done, n in chunks]
    if batch:
        works.append(cached_work(model, "da", batch, round(context_len), da_bits))
    return timer.lane_s(merge_works(works), sum(n for _, n in chunks) + batch)


def _f_lane_s(timer: StageTimer, tokens: int) -> float:
    """One lane's F stage over ``tokens`` tokens of both phases (F work depends on tokens only)."""
    return timer.prefill_uniform_s(1, tokens) if tokens > 0 else 0.0


def mixed_iteration(
    unit: UnitTimer, lane_chunks: Sequence[Sequence[Chunk]], batch: int, context_len: float
) -> IterTime:
    """One token-budget iteration of a unit hosting both phases: lane ``i`` prefills the chunks
    ``lane_chunks[i]`` while every lane decodes its share of ``batch`` running sequences (mean
    cached context ``context_len``); the iteration ends with the slowest lane."""
    a: PoolTimer = unit.a
    f: PoolTimer = unit.f
    b_a = math.ceil(batch / a.lanes) if batch else 0
    da_bits = a.timers["da"].bits
    split = unit.unit.is_split
    t_a = 0.0
    for chunks in lane_chunks or [()]:
        t = _a_lane_s(a.timers["pa"], chunks, b_a, context_len, da_bits)
        if not split:
            t += _f_lane_s(f.timers["pf"], sum(n for _, n in chunks) + b_a)
        t_a = max(t_a, t)
    if not split:
        return IterTime(time_s=t_a, a_busy_s=t_a, f_busy_s=0.0, fwd_bytes=0.0, bwd_bytes=0.0)
    prompt_tokens = sum(n for chunks in lane_chunks for _, n in chunks)
    t_f = _f_lane_s(f.timers["pf"], math.ceil((prompt_tokens + batch) / f.lanes))
    pre, dec = unit.crossings["prefill"], unit.crossings["decode"]
    fwd = pre * prompt_tokens * unit.act_a["prefill"] + dec * batch * unit.act_a["decode"]
    bwd = pre * prompt_tokens * unit.act_f["prefill"] + dec * batch * unit.act_f["decode"]
    t_x = max(fwd, bwd) / unit.bw + max(pre if prompt_tokens else 0, dec if batch else 0) * unit.latency_s
    return IterTime(
        time_s=af_layer_s(t_a, t_f, t_x, unit.m), a_busy_s=t_a, f_busy_s=t_f, fwd_bytes=fwd, bwd_bytes=bwd
    )

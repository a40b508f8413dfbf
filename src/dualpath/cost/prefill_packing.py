"""How aggregated serving packs the prompts of one round into prefill iterations.

**Greedy chunked packing** (vLLM V1, SGLang: ``CHUNKED_PREFILL``). Every prefill iteration is
filled to the token budget: the scheduler serves the running requests first (a partly prefilled
prompt continues with as much of its remainder as fits), then the waiting ones in order, each
taking ``min(its remaining tokens, the budget left)`` (vLLM V1 ``Scheduler.schedule``; SGLang's
``PrefillAdder`` with ``chunked_prefill_size``, the chunked request continued first in the next
batch). So the round's ``n`` prompts form one stream of ``n x isl`` tokens cut into iterations of
``budget`` tokens, and a prompt straddles an iteration boundary wherever one falls inside it:
request ``j`` holds tokens ``[j isl, (j + 1) isl)``, runs from iteration ``j isl // budget`` to
``(j + 1) isl // budget`` and emits its first token with the last. A boundary that falls exactly on
the end of a prompt counts as cutting it (its last token waits for the next iteration): the
prefill budget of a real iteration is ``MAX_NUM_TOKENS`` less a decode count that moves by a row
or two from one iteration to the next, so an exact fit does not survive, and counting it as a
miss keeps TTFT from dropping where ``isl`` grows into an exact fit (e.g. by a quarter at
``isl = budget``). The last iteration holds the rest of the stream (none, when the stream ends
exactly on a boundary: the last prompt's first token then comes one iteration later).

**Whole prompts** (TensorRT-LLM, which does not chunk by default): ``max(1, budget // isl)``
prompts per iteration, the groups evened out (``n / ceil(n / per_iteration)`` each); a prompt
longer than the budget runs whole in one iteration (the deployment must have raised its
``max_num_tokens`` to serve it).

An iteration that holds ``tok`` prompt tokens is priced as ``tok / isl`` prompts of ``isl`` where
``tok >= isl``, else as one chunk of ``tok`` new tokens after ``(isl - tok) / 2`` cached ones: the
same GEMM tokens and the same attention pairs (``tok x isl``) as a chunk at a uniformly placed
offset inside the prompt, and both forms agree at ``tok = isl``. (The DeepSeek-V3 MLA module
table has no prefix axis: cost/forward.py reads it at ``isl + prefix``, as it read chunks before.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dualpath.cost.forward import Step


@dataclass(frozen=True, slots=True)
class Packing:
    """Units (requests, or TensorRT-LLM's groups of whole prompts) laid out in prefill iterations."""

    first: np.ndarray  # each unit's first prefill iteration
    last: np.ndarray  # each unit's last prefill iteration (its first token)
    tokens: np.ndarray  # prompt tokens of each prefill iteration
    weight: float  # requests per unit

    @property
    def iterations(self) -> int:
        return len(self.tokens)

    @property
    def own(self) -> np.ndarray:
        """Prefill iterations each unit takes."""
        return self.last - self.first + 1


def greedy(requests: int, isl: int, budget: int) -> Packing:
    """Chunked prefill filling every iteration to ``budget`` (see the module doc)."""
    j = np.arange(requests, dtype=np.int64)
    first = j * isl // budget
    last = (j + 1) * isl // budget  # a prompt ending exactly on a boundary counts as cut
    total = requests * isl
    tokens = np.clip(total - np.arange(int(last[-1]) + 1, dtype=np.int64) * budget, 0, budget)
    return Packing(first, last, tokens.astype(float), 1.0)


def whole(requests: int, isl: int, budget: int) -> Packing:
    """Whole prompts, ``max(1, budget // isl)`` per iteration, the groups evened out."""
    groups = math.ceil(requests / max(1, budget // isl))
    units = np.arange(groups, dtype=np.int64)
    per_group = requests / groups
    return Packing(units, units, np.full(groups, per_group * isl), per_group)


def prefill_step(tok: float, isl: int, *, gen_requests: float = 0.0, kv_len: float = 0.0) -> Step:
    """One iteration holding ``tok`` prompt tokens and ``gen_requests`` decode rows (module doc)."""
    if tok >= isl:
        return Step(ctx_requests=tok / isl, isl=isl, gen_requests=gen_requests, kv_len=kv_len)
    if tok >= 1:
        new = int(tok)
        return Step(
            ctx_requests=1, isl=new, prefix=(isl - new) // 2, gen_requests=gen_requests, kv_len=kv_len
        )
    return Step(gen_requests=gen_requests, kv_len=kv_len)


def cyclic_cover(period: int, starts: np.ndarray, lengths: np.ndarray | int) -> np.ndarray:
    """How many of the windows ``[s, s + length)`` (mod ``period``) cover each position."""
    starts = np.asarray(starts, dtype=np.int64) % period
    lengths = np.broadcast_to(np.asarray(lengths, dtype=np.int64), starts.shape)
    full, rest = np.divmod(np.maximum(lengths, 0), period)
    ends = starts + rest
    size = period + 1
    out = np.bincount(starts, minlength=size) - np.bincount(np.minimum(ends, period), minlength=size)
    wrap = ends > period
    out[0] += int(full.sum()) + int(wrap.sum())
    out -= np.bincount(ends[wrap] - period, minlength=size)
    return np.cumsum(out)[:period]

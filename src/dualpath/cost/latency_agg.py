"""Steady-state TTFT and TPOT of aggregated serving: the closed loop's iteration schedule.

One replica serves prefill and decode with continuous batching; ``concurrency`` clients each
re-submit as soon as their request's last token arrives (a closed loop, as genai-perf / aiperf /
``vllm bench serve --max-concurrency`` run it). Each attention rank holds ``b`` of them: the busiest
rank's ``ceil(concurrency / attention_dp)`` (the ranks meet at every MoE gather), capped by its KV
pool (cost/memory.py; clients beyond the pool wait ``(clients - b) / b`` periods, in TTFT).

**Groups.** The clients start together; the engine prefills ``g = budget // isl`` whole prompts
per iteration (``budget``: ``MAX_NUM_TOKENS`` less the decode tokens that share it, at least a
quarter), or ``budget / isl`` where the backend chunks prompts to fill the budget
(``CHUNKED_PREFILL``: vLLM, SGLang), a longer prompt one at a time over ``chunks = ceil(isl /
budget)`` iterations of equal size. TensorRT-LLM does not chunk by default, so a prompt longer
than the budget runs whole in one iteration (the deployment must have raised its
``max_num_tokens`` to serve it). Where the packing changes (e.g. two 4000-token prompts per
iteration at concurrency 128, one at 256) TTFT can fall as concurrency rises: the iterations a
request waits for get smaller. So the
``G = ceil(b / g)`` groups are prefilled in consecutive iterations, and with fixed ``isl`` and
``osl`` every group has the same period and they stay staggered one prefill block apart.

**One group's period**, in iterations: its ``chunks`` prefill iterations (the first token comes
with the last), ``osl - 1`` decode iterations, then ``D = ARRIVAL_WAIT_ITERATIONS +
OVERLAP_EXTRA_STEPS`` iterations before its next prefill: with an overlapped scheduler (the default
of all three backends, cost/latency_terms.py) the iteration after the last token is already
launched with the finished requests in it (``OVERLAP_EXTRA_STEPS = 1``), and the next one is
scheduled before the re-submitted requests arrive (``ARRIVAL_WAIT_ITERATIONS = 1``). The period is
``T = max(chunks + osl - 1 + D, G x chunks)``; when the prefills need more (prefill-bound) the
excess is queueing, in TTFT.

**Positions.** Laying the ``T`` iterations of one period out (prefill iterations first, group by
group, then decode-only ones) gives each iteration its work: the prefilling group's prompts (or
chunk) plus one decode row for every request holding a slot (decoding, or in its extra step); an
iteration with nothing in it costs nothing (the engine idles until the requests arrive). A
request's TTFT is its wait window (the ``D`` iterations, or more when prefill-bound, before its
group's prefill: typically the *previous groups' prefill iterations*, since the groups are
adjacent) plus its own prefill iterations; its TPOT the mean of the ``osl - 1`` iterations after
them (the other groups' prefills stall it there). Both are averaged over the groups.

**Prefill apart from decode** (SGLang's default: no ``--enable-mixed-chunk``): a prefill
iteration holds prompts only and the decoding requests wait through it, so every group starts
decoding at the same iteration and, with a fixed ``osl``, all finish together: the stagger
collapses and each round is ``G x chunks`` prefill iterations, then ``osl - 1`` decode iterations
of all ``b``, then the overlapped extra step. Group ``k`` waits for the extra step and the ``k - 1``
prefills before its own (TTFT: the extra step + ``(G + 1) / 2`` group prefills on average); a
decoding request sits through the later groups' prefills (``(G - 1) / 2`` on average) in its TPOT.

With ``pp > 1`` decode runs ``pp`` micro-batches: a token of a request takes one pass of all layers
over its micro-batch, plus the stage-to-stage activation transfers.
"""

from __future__ import annotations

import math

import numpy as np

from dualpath.cost.forward import Forward, Step, StepTime
from dualpath.cost.latency import Prediction, _accumulate, _check, _kv_cap, _ms, _pp_s, _sources
from dualpath.cost.latency_terms import (
    ARRIVAL_WAIT_ITERATIONS,
    CHUNKED_PREFILL,
    MIXED_BATCHES,
    overlap_extra_steps,
    prefill_budget_tokens,
)


def _cyclic_cover(period: int, starts: np.ndarray, length: int) -> np.ndarray:
    """How many of the windows ``[s, s + length)`` (mod ``period``) cover each position."""
    out = np.zeros(period + 1, dtype=np.int64)
    if length <= 0:
        return out[:period]
    full, rest = divmod(length, period)
    out[0] += full * len(starts)
    if rest:
        s = starts % period
        e = s + rest
        np.add.at(out, s, 1)
        np.add.at(out, np.minimum(e, period), -1)
        wrap = e > period
        np.add.at(out, np.zeros(int(wrap.sum()), dtype=np.int64), 1)
        np.add.at(out, e[wrap] - period, -1)
    return np.cumsum(out)[:period]


def predict_agg(fw: Forward, *, isl: int, osl: int, concurrency: float) -> Prediction:
    """Aggregated serving (see the module doc)."""
    _check(isl, osl, concurrency)
    fw.par.check(fw.model)
    pp = fw.par.pp
    clients = float(max(math.ceil(concurrency / fw.par.attention_dp - 1e-9), 1))
    b, notes = _kv_cap(fw, clients, isl + osl, "agg")
    if not MIXED_BATCHES.get(fw.backend, True):
        return _alternating(fw, isl=isl, osl=osl, clients=clients, b=b, notes=notes)
    tokens = prefill_budget_tokens(fw.backend, fw.kernels.system.gpu.capacity_bytes)
    budget = max(tokens - int(b), tokens // 4)  # decode tokens take their share
    chunking = CHUNKED_PREFILL.get(fw.backend, False)
    # a backend that does not chunk serves a longer prompt only with a budget raised to hold it
    chunks = math.ceil(isl / budget) if chunking else 1
    size = math.ceil(isl / chunks)  # prompt tokens per chunk iteration (an even split)
    fill = budget / isl if chunking else float(max(1, budget // isl))
    per_group = 1.0 if chunks > 1 else min(b, fill)
    groups = max(1, math.ceil(b / per_group - 1e-9))
    g = b / groups  # prompts per prefill iteration (the groups evened out)
    extra = overlap_extra_steps(fw.backend)
    wait = ARRIVAL_WAIT_ITERATIONS + extra
    holds = chunks + (osl - 1) + extra  # iterations a request holds its slot
    prefill_iters = groups * chunks
    period = max(chunks + (osl - 1) + wait, prefill_iters)
    starts = np.arange(groups, dtype=np.int64) * chunks
    absent = _cyclic_cover(period, starts + holds, period - holds)
    pos = np.arange(period)
    prefilling = pos < prefill_iters
    decoders = groups - absent - prefilling.astype(np.int64)
    kv = isl + osl / 2

    steps: dict[tuple[int, int], tuple[StepTime, float]] = {}

    def cost(p: int) -> tuple[StepTime, float]:
        chunk = int(p % chunks) if prefilling[p] else -1
        key = (chunk, int(decoders[p]))
        if key not in steps:
            rows = g * key[1] / pp
            if chunk >= 0:
                new = min(size, isl - chunk * size)
                st = fw.step(Step(ctx_requests=g, isl=new, prefix=chunk * size, gen_requests=rows, kv_len=kv))
                steps[key] = (st, st.time_s + _pp_s(fw, g * new + rows))
            elif rows > 0:
                st = fw.step(Step(gen_requests=rows, kv_len=kv))
                steps[key] = (st, st.time_s + _pp_s(fw, rows))
            else:  # nobody holds a slot: the engine idles until the requests arrive
                steps[key] = (StepTime(), 0.0)
        return steps[key]

    times = np.array([cost(p)[1] for p in range(period)])
    keys = [(int(p % chunks) if prefilling[p] else -1, int(decoders[p])) for p in range(period)]
    window = period - chunks - (osl - 1)  # iterations between a request's last token and its prefill
    wait_cover = _cyclic_cover(period, starts - window, window) / groups
    own_cover = _cyclic_cover(period, starts, chunks) / groups
    dec_cover = _cyclic_cover(period, starts + chunks, osl - 1) / groups
    wait_s = float(wait_cover @ times)
    own_w: dict[tuple[int, int], float] = {}
    dec_w: dict[tuple[int, int], float] = {}
    for p in np.flatnonzero(own_cover):
        own_w[keys[p]] = own_w.get(keys[p], 0.0) + float(own_cover[p])
    for p in np.flatnonzero(dec_cover):
        dec_w[keys[p]] = dec_w.get(keys[p], 0.0) + float(dec_cover[p]) / (osl - 1)
    own, tpot = StepTime(), StepTime()
    for key, w in own_w.items():
        _accumulate(own, steps[key][0], w)
    for key, w in dec_w.items():
        _accumulate(tpot, steps[key][0], w)
    own_s = float(own_cover @ times)
    tpot_s = float(dec_cover @ times) / (osl - 1) if osl > 1 else 0.0
    # KV-bound: the clients beyond the pool wait (clients - b) / b periods for a slot
    queue_s = (clients - b) / b * float(times.sum())
    ttft_s = wait_s + own_s + queue_s
    prefill_wait = float(wait_cover[prefilling].sum())
    return Prediction(
        ttft_s=ttft_s,
        tpot_s=tpot_s,
        breakdown_ms={
            "ttft": _ms(
                own, {"wait_for_iteration": wait_s, "queue_wait": queue_s, "pp_p2p": own_s - own.time_s}
            ),
            "tpot": _ms(tpot, {"pp_p2p": tpot_s - tpot.time_s}) if osl > 1 else {},
            "batch": {
                "prefill_group": g,
                "groups": float(groups),
                "period_iterations": float(period),
                "wait_iterations": float(window),
                "prefill_iterations_in_wait": prefill_wait,
                "prefill_iteration_share": float(dec_cover[prefilling].sum()) / max(osl - 1, 1),
                "decodes_per_prefill_iteration": float(g * decoders[0]),
                "decodes_per_decode_iteration": float(g * decoders[-1]) if period > prefill_iters else 0.0,
                "running_per_rank": b,
            },
        },
        source=_sources(*(st for st, _ in steps.values())),
        notes=tuple(notes),
    )


def _alternating(
    fw: Forward, *, isl: int, osl: int, clients: float, b: float, notes: list[str]
) -> Prediction:
    """A backend that runs prefill iterations apart from decode ones (see the module doc)."""
    pp = fw.par.pp
    budget = prefill_budget_tokens(fw.backend, fw.kernels.system.gpu.capacity_bytes)  # prompts only
    chunks = math.ceil(isl / budget)
    size = math.ceil(isl / chunks)
    per_group = 1.0 if chunks > 1 else min(b, budget / isl)
    groups = max(1, math.ceil(b / per_group - 1e-9))
    g = b / groups
    kv = isl + osl / 2
    own, own_s = StepTime(), 0.0
    for c in range(chunks):
        new = min(size, isl - c * size)
        st = fw.step(Step(ctx_requests=g, isl=new, prefix=c * size))
        own_s += st.time_s + _pp_s(fw, g * new)
        _accumulate(own, st, 1.0)
    dec = fw.step(Step(gen_requests=b / pp, kv_len=kv))
    dec_s = dec.time_s + _pp_s(fw, b / pp)
    extra = overlap_extra_steps(fw.backend)
    before = (groups - 1) / 2  # mean group prefills ahead of a request's own
    after = (groups - 1) / 2  # mean group prefills a decoding request sits through
    wait_s = extra * dec_s + before * own_s
    round_s = groups * own_s + (osl - 1 + extra) * dec_s
    queue_s = (clients - b) / b * round_s
    tpot = StepTime()
    tpot_s = 0.0
    if osl > 1:
        tpot_s = (after * own_s + (osl - 1) * dec_s) / (osl - 1)
        _accumulate(tpot, dec, 1.0)
        _accumulate(tpot, own, after / (osl - 1))
    return Prediction(
        ttft_s=wait_s + own_s + queue_s,
        tpot_s=tpot_s,
        breakdown_ms={
            "ttft": _ms(
                own, {"wait_for_iteration": wait_s, "queue_wait": queue_s, "pp_p2p": own_s - own.time_s}
            ),
            "tpot": _ms(tpot, {"pp_p2p": tpot_s - tpot.time_s}) if osl > 1 else {},
            "batch": {
                "prefill_group": g,
                "groups": float(groups),
                "period_iterations": float(groups * chunks + osl - 1 + extra),
                "wait_iterations": extra + before * chunks,
                "prefill_iterations_in_wait": before * chunks,
                "prefill_iteration_share": after * chunks / max(osl - 1, 1),
                "decodes_per_prefill_iteration": 0.0,
                "decodes_per_decode_iteration": b,
                "running_per_rank": b,
            },
        },
        source=_sources(own, dec),
        notes=tuple(notes),
    )

"""Steady-state TTFT and TPOT of aggregated serving: the closed loop's iteration schedule.

One replica serves prefill and decode with continuous batching; ``concurrency`` clients each
re-submit as soon as their request's last token arrives (a closed loop, as genai-perf / aiperf /
``vllm bench serve --max-concurrency`` run it). Each attention rank holds ``b`` of them: the busiest
rank's ``ceil(concurrency / attention_dp)`` (the ranks meet at every MoE gather), capped by its KV
pool (cost/memory.py; clients beyond the pool wait ``(clients - b) / b`` periods, in TTFT).

**Packing** (cost/prefill_packing.py). The clients start together, so each round's prompts are
prefilled in consecutive iterations. vLLM and SGLang (``CHUNKED_PREFILL``) fill every prefill
iteration greedily to the token budget (``budget``: ``MAX_NUM_TOKENS`` less the decode tokens that
share it, at least a quarter): the ``b`` prompts form one stream of ``b x isl`` tokens cut into
``P = b x isl // budget + 1`` iterations, and a prompt straddles a boundary wherever one falls
inside it (its first token comes with its last iteration). TensorRT-LLM does not chunk by
default: ``max(1, budget // isl)`` whole prompts per iteration in ``P = ceil(b / that)`` groups
evened out (a prompt longer than the budget runs whole in one iteration; the deployment must
have raised its ``max_num_tokens`` to serve it). Where that packing changes (two 4000-token
prompts per iteration at 128 clients, one at 256; or one 4081-token prompt instead of two
4000-token ones) TTFT can fall as concurrency or the prompt grows: the iterations a request waits
for get smaller. Greedy packing is what the chunking schedulers do, and is continuous where a
prompt crosses the budget (docs/notes/cost-prefill-packing.md: the even split it replaced).

**One request's period**, in iterations: its ``own`` prefill iterations (the first token comes
with the last), ``osl - 1`` decode iterations, then ``D = ARRIVAL_WAIT_ITERATIONS +
OVERLAP_EXTRA_STEPS`` iterations before its next prefill: with an overlapped scheduler (the default
of all three backends, cost/latency_terms.py) the iteration after the last token is already
launched with the finished requests in it (``OVERLAP_EXTRA_STEPS = 1``), and the next one is
scheduled before the re-submitted requests arrive (``ARRIVAL_WAIT_ITERATIONS = 1``). The layout's
period is ``T = max(P, max(own) + osl - 1 + D)``; when the prefills need more than a request's life
(prefill-bound) a request waits ``P - own - (osl - 1)`` iterations instead of ``D``: queueing, in
TTFT.

**Positions.** Laying the ``T`` iterations of one period out (the ``P`` prefill iterations first,
then decode-only ones) gives each iteration its work: its prompt tokens plus one decode row for
every request holding a slot (after its last prefill iteration: decoding, or in its extra step);
an iteration with nothing in it costs nothing (the engine idles until the requests arrive). A
request's TTFT is its wait window (the ``D`` iterations before its first prefill iteration:
typically the *previous requests' prefill iterations*, since the prompts are adjacent in the
stream) plus its own prefill iterations; its TPOT the mean of the ``osl - 1`` iterations after
them (the later prefills stall it there). Both are averaged over the requests (TensorRT-LLM's
groups).

**Prefill apart from decode** (SGLang's default: no ``--enable-mixed-chunk``): a prefill
iteration holds prompts only (greedy chunks of ``prefill_budget_tokens``) and the decoding requests
wait through it, so every request starts decoding at the same iteration and, with a fixed
``osl``, all finish together: the stagger collapses and each round is the ``P`` prefill iterations,
then ``osl - 1`` decode iterations of all ``b``, then the overlapped extra step. A request waits
for the extra step and the round's prefill iterations before its first one, then its own (TTFT
about the extra step + half the round's prefills); a decoding request sits through the prefill
iterations after its last one (about the other half) in its TPOT.

With ``pp > 1`` decode runs ``pp`` micro-batches: a token of a request takes one pass of all layers
over its micro-batch, plus the stage-to-stage activation transfers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
from dualpath.cost.prefill_packing import Packing, cyclic_cover, greedy, prefill_step, whole


def predict_agg(fw: Forward, *, isl: int, osl: int, concurrency: float) -> Prediction:
    """Aggregated serving (see the module doc)."""
    _check(isl, osl, concurrency)
    fw.par.check(fw.model)
    clients = float(max(math.ceil(concurrency / fw.par.attention_dp - 1e-9), 1))
    b, notes = _kv_cap(fw, clients, isl + osl, "agg")
    if not MIXED_BATCHES.get(fw.backend, True):
        return _alternating(fw, isl=isl, osl=osl, clients=clients, b=b, notes=notes)
    cycle = _mixed_cycle(fw, isl, osl, b)
    keys, steps = _cycle_steps(fw, cycle, isl, osl)
    return _mixed_prediction(cycle, keys, steps, osl=osl, clients=clients, b=b, notes=notes)


@dataclass(frozen=True, slots=True)
class _Cycle:
    """One period of a mixed-batch engine: ``n`` requests packed into prefill iterations
    (``pack``), ``period`` iterations in all, ``waits`` each request's iterations between its last
    token and its next prefill, ``decoders`` the decode rows of each iteration."""

    n: int
    pack: Packing
    period: int
    waits: np.ndarray
    decoders: np.ndarray


def _mixed_cycle(fw: Forward, isl: int, osl: int, b: float) -> _Cycle:
    """The period: prefills packed within the backend's token budget, then decodes."""
    n = max(1, round(b))  # b is a count (clients, or the KV cap floored)
    tokens = prefill_budget_tokens(fw.backend, fw.kernels.system.gpu.capacity_bytes)
    budget = max(tokens - int(b), tokens // 4)  # decode tokens take their share
    pack = (greedy if CHUNKED_PREFILL.get(fw.backend, False) else whole)(n, isl, budget)
    prefill_iters, own = pack.iterations, pack.own
    extra = overlap_extra_steps(fw.backend)
    wait = ARRIVAL_WAIT_ITERATIONS + extra
    period = max(prefill_iters, int(own.max()) + (osl - 1) + wait)
    # the iterations between a request's last token and its next prefill: the two it must wait,
    # or (prefill-bound) what the period leaves
    waits = np.maximum(wait, prefill_iters - own - (osl - 1))
    decoders = pack.weight * cyclic_cover(period, pack.last + 1, osl - 1 + extra)
    return _Cycle(n=n, pack=pack, period=period, waits=waits, decoders=decoders)


_StepKey = tuple[float, float]  # (prefill tokens, decode rows) of one iteration


def _cycle_steps(
    fw: Forward, cycle: _Cycle, isl: int, osl: int
) -> tuple[list[_StepKey], dict[_StepKey, tuple[StepTime, float]]]:
    """Each iteration's key and, once per distinct key, its step and seconds (pipeline hops in)."""
    pp, pack, kv = fw.par.pp, cycle.pack, isl + osl / 2
    steps: dict[_StepKey, tuple[StepTime, float]] = {}

    def cost(p: int) -> _StepKey:
        key = (float(pack.tokens[p]) if p < pack.iterations else 0.0, float(cycle.decoders[p]))
        if key not in steps:
            tok, rows = key[0], key[1] / pp
            if tok > 0 or rows > 0:
                st = fw.step(prefill_step(tok, isl, gen_requests=rows, kv_len=kv))
                steps[key] = (st, st.time_s + _pp_s(fw, tok + rows))
            else:  # nobody holds a slot: the engine idles until the requests arrive
                steps[key] = (StepTime(), 0.0)
        return key

    return [cost(p) for p in range(cycle.period)], steps


def _mixed_prediction(
    cycle: _Cycle,
    keys: list[_StepKey],
    steps: dict[_StepKey, tuple[StepTime, float]],
    *,
    osl: int,
    clients: float,
    b: float,
    notes: list[str],
) -> Prediction:
    """TTFT and TPOT as the period's iterations each request waits, prefills and decodes in."""
    pack, period, units = cycle.pack, cycle.period, len(cycle.pack.first)
    times = np.array([steps[k][1] for k in keys])
    wait_cover = cyclic_cover(period, pack.first - cycle.waits, cycle.waits) / units
    own_cover = cyclic_cover(period, pack.first, pack.own) / units
    dec_cover = cyclic_cover(period, pack.last + 1, osl - 1) / units
    own_st, tpot = StepTime(), StepTime()
    for p in np.flatnonzero(own_cover):
        _accumulate(own_st, steps[keys[p]][0], float(own_cover[p]))
    for p in np.flatnonzero(dec_cover):
        _accumulate(tpot, steps[keys[p]][0], float(dec_cover[p]) / (osl - 1))
    wait_s = float(wait_cover @ times)
    own_s = float(own_cover @ times)
    tpot_s = float(dec_cover @ times) / (osl - 1) if osl > 1 else 0.0
    # KV-bound: the clients beyond the pool wait (clients - b) / b periods for a slot
    queue_s = (clients - b) / b * float(times.sum())
    return Prediction(
        ttft_s=wait_s + own_s + queue_s,
        tpot_s=tpot_s,
        breakdown_ms={
            "ttft": _ms(
                own_st, {"wait_for_iteration": wait_s, "queue_wait": queue_s, "pp_p2p": own_s - own_st.time_s}
            ),
            "tpot": _ms(tpot, {"pp_p2p": tpot_s - tpot.time_s}) if osl > 1 else {},
            "batch": _mixed_batch(cycle, wait_cover, dec_cover, osl=osl, b=b),
        },
        source=_sources(*(st for st, _ in steps.values())),
        notes=tuple(notes),
    )


def _mixed_batch(
    cycle: _Cycle, wait_cover: np.ndarray, dec_cover: np.ndarray, *, osl: int, b: float
) -> dict[str, float]:
    """The period's shape: prefill groups, iterations, and what a request's wait and decode see."""
    pack, period = cycle.pack, cycle.period
    prefilling = np.arange(period) < pack.iterations
    return {
        "prefill_group": cycle.n / pack.iterations,
        "groups": float(pack.iterations),
        "prefill_iterations_per_request": float(pack.own.mean()),
        "period_iterations": float(period),
        "wait_iterations": float(cycle.waits.mean()),
        "prefill_iterations_in_wait": float(wait_cover[prefilling].sum()),
        "prefill_iteration_share": float(dec_cover[prefilling].sum()) / max(osl - 1, 1),
        "decodes_per_prefill_iteration": float(cycle.decoders[0]),
        "decodes_per_decode_iteration": float(cycle.decoders[-1]) if period > pack.iterations else 0.0,
        "running_per_rank": b,
    }


def _alternating(
    fw: Forward, *, isl: int, osl: int, clients: float, b: float, notes: list[str]
) -> Prediction:
    """A backend that runs prefill iterations apart from decode ones (see the module doc)."""
    rnd = _alternating_round(fw, isl, osl, b)
    pack, pre, done, dec_s, extra = rnd.pack, rnd.prefill, rnd.done, rnd.decode_s, rnd.extra
    before = float(
        np.mean(done[pack.first] - rnd.prefill_s[pack.first])
    )  # the round's prefills before a request's
    own_s = float(np.mean(done[pack.last])) - before
    after = float(done[-1]) - before - own_s  # the later prefills a decoding request sits through
    own_cover = cyclic_cover(pack.iterations, pack.first, pack.own) / rnd.n
    after_cover = cyclic_cover(pack.iterations, pack.last + 1, pack.iterations - 1 - pack.last) / rnd.n
    own = StepTime()
    for i in np.flatnonzero(own_cover):
        _accumulate(own, pre[float(pack.tokens[i])], float(own_cover[i]))
    wait_s = extra * dec_s + before
    round_s = float(done[-1]) + (osl - 1 + extra) * dec_s
    queue_s = (clients - b) / b * round_s
    tpot = StepTime()
    tpot_s = 0.0
    if osl > 1:
        tpot_s = (after + (osl - 1) * dec_s) / (osl - 1)
        _accumulate(tpot, rnd.decode, 1.0)
        for i in np.flatnonzero(after_cover):
            _accumulate(tpot, pre[float(pack.tokens[i])], float(after_cover[i]) / (osl - 1))
    return Prediction(
        ttft_s=wait_s + own_s + queue_s,
        tpot_s=tpot_s,
        breakdown_ms={
            "ttft": _ms(
                own, {"wait_for_iteration": wait_s, "queue_wait": queue_s, "pp_p2p": own_s - own.time_s}
            ),
            "tpot": _ms(tpot, {"pp_p2p": tpot_s - tpot.time_s}) if osl > 1 else {},
            "batch": _alternating_batch(rnd, osl, b),
        },
        source=_sources(rnd.decode, *pre.values()),
        notes=tuple(notes),
    )


@dataclass(frozen=True, slots=True)
class _Round:
    """One round of an alternating engine: ``n`` requests' prompts packed into prefill iterations
    (``pack``; each distinct one's step in ``prefill``, its seconds in ``prefill_s``, their running
    sum in ``done``), then decode iterations of ``decode`` (``decode_s`` each)."""

    n: int
    pack: Packing
    prefill: dict[float, StepTime]
    prefill_s: np.ndarray
    done: np.ndarray
    decode: StepTime
    decode_s: float
    extra: int


def _alternating_round(fw: Forward, isl: int, osl: int, b: float) -> _Round:
    pp = fw.par.pp
    budget = prefill_budget_tokens(fw.backend, fw.kernels.system.gpu.capacity_bytes)  # prompts only
    n = max(1, round(b))
    pack = greedy(n, isl, budget)
    pre: dict[float, StepTime] = {}
    for tok in set(pack.tokens.tolist()):
        pre[tok] = fw.step(prefill_step(tok, isl))
    pre_s = np.array([pre[t].time_s + _pp_s(fw, t) for t in pack.tokens.tolist()])
    done = np.cumsum(pre_s)  # the round's prefill time up to the end of each iteration
    dec = fw.step(Step(gen_requests=b / pp, kv_len=isl + osl / 2))
    dec_s = dec.time_s + _pp_s(fw, b / pp)
    extra = overlap_extra_steps(fw.backend)
    return _Round(
        n=n, pack=pack, prefill=pre, prefill_s=pre_s, done=done, decode=dec, decode_s=dec_s, extra=extra
    )


def _alternating_batch(rnd: _Round, osl: int, b: float) -> dict[str, float]:
    pack = rnd.pack
    mean_before = float(np.mean(pack.first))
    return {
        "prefill_group": rnd.n / pack.iterations,
        "groups": float(pack.iterations),
        "prefill_iterations_per_request": float(pack.own.mean()),
        "period_iterations": float(pack.iterations + osl - 1 + rnd.extra),
        "wait_iterations": rnd.extra + mean_before,
        "prefill_iterations_in_wait": mean_before,
        "prefill_iteration_share": float(np.mean(pack.iterations - 1 - pack.last)) / max(osl - 1, 1),
        "decodes_per_prefill_iteration": 0.0,
        "decodes_per_decode_iteration": b,
        "running_per_rank": b,
    }

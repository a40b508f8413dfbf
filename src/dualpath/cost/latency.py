"""Steady-state TTFT and TPOT of a deployment (``dualpath plan latency``), from cost/forward.py.

Aggregated (one replica serves prefill and decode, continuous batching, ``concurrency`` clients
each re-submitting as soon as its request finishes): each attention rank holds
``b = concurrency / attention_dp`` requests. Benchmark clients start all ``b`` at once, and the
engine prefills them in groups of ``g = budget // isl`` prompts, ``budget`` being its token budget
per iteration (``MAX_NUM_TOKENS``) less the ``b`` decode tokens that share it (at least a quarter
of it); a longer prompt is chunked over ``ceil(isl / budget)`` iterations. With a
fixed ``osl`` every group also finishes together and comes back together, so the groups stay
staggered: a request spends ``busy = osl - 1 + chunks`` iterations in the batch, and a cycle has
``max(busy, b / g x chunks)`` iterations (longer when prefill is the bottleneck; the excess is
queueing). Each cycle holds ``b / g x chunks`` prefill iterations (a group's prompts plus the
``b (osl - 1) / cycle`` decode tokens of the others, KV length ``isl + osl / 2``) and decode-only
iterations for the rest. TPOT is the mean iteration a decoding request goes through: the other
groups' prefill iterations (they stall it) in their share, decode-only ones otherwise. TTFT = the
request's own group-prefill iteration(s) + the queueing + ``ARRIVAL_WAIT_ITERATIONS`` mean
iterations: a re-submitted request lands just after the next iteration of the other groups
started and waits for it to end (no wait when its group is the whole batch: the engine is idle
when it arrives). With ``pp > 1``
decode runs ``pp`` micro-batches: a token of a request takes one pass of all layers over its
micro-batch, plus the stage-to-stage activation transfers. The running batch is capped by the KV
pool (cost/memory.py); clients beyond it wait ``(clients - b) / b`` cycles, counted in TTFT.

Disaggregated: a prefill worker runs batches of up to ``prefill_batch`` prompts; TTFT = queueing
(M/D/1 on the prefill workers at the closed-loop arrival rate) + the prefill batch + the KV
transfer to the decode worker (its link at ``KV_TRANSFER_EFFICIENCY``, plus the p2p latency);
when the prefill workers or the decode slots cannot carry the closed-loop rate, Little's law
(``concurrency = rate x (TTFT + (osl - 1) TPOT)``) puts the excess wait in TTFT.
TPOT = a decode iteration of ``min(decode_batch, requests in decode / decode_workers)``.
The arrival rate ``concurrency / (TTFT + (osl - 1) TPOT)`` and the two times are solved together
by a short fixed-point iteration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dualpath.core.errors import require
from dualpath.cost.forward import Forward, Step, StepTime
from dualpath.cost.latency_terms import (
    ARRIVAL_WAIT_ITERATIONS,
    KV_TRANSFER_EFFICIENCY,
    MAX_NUM_TOKENS,
)
from dualpath.cost.memory import max_requests_per_rank

FIXED_POINT_ROUNDS = 12


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """TTFT / TPOT in seconds, their op breakdowns (ms) and each op's source."""

    ttft_s: float
    tpot_s: float
    breakdown_ms: dict[str, dict[str, float]]
    source: dict[str, str]
    notes: tuple[str, ...] = ()
    tables: dict[str, str] | None = None  # op folder -> framework and version of its tables

    @property
    def fallback_ops(self) -> tuple[str, ...]:
        """Ops at least partly from the roofline or the ring formula (no table point)."""
        return tuple(op for op, src in self.source.items() if "roofline" in src or src.startswith("ring"))

    def to_json(self) -> dict[str, object]:
        return {
            "ttft_ms": self.ttft_s * 1e3,
            "tpot_ms": self.tpot_s * 1e3,
            "breakdown": self.breakdown_ms,
            "source": self.source,
            "fallback_ops": list(self.fallback_ops),
            "notes": list(self.notes),
            "tables": self.tables or {},
        }


def _ms(step: StepTime, extra: dict[str, float] | None = None) -> dict[str, float]:
    out = {op: t * 1e3 for op, t in sorted(step.breakdown_s.items()) if t > 0}
    out.update({k: v * 1e3 for k, v in (extra or {}).items()})
    return out


def _sources(*steps: StepTime) -> dict[str, str]:
    merged: dict[str, set[str]] = {}
    for step in steps:
        for op, srcs in step.sources.items():
            merged.setdefault(op, set()).update(srcs)
    return {op: "; ".join(sorted(s)) for op, s in sorted(merged.items())}


def _pp_s(fw: Forward, tokens: float) -> float:
    """Stage-to-stage activation transfers of one pass (``pp - 1`` hops, BF16 hidden states)."""
    pp = fw.par.pp
    if pp == 1:
        return 0.0
    system = fw.kernels.system
    hop = tokens * fw.model.hidden_size * 2 / system.link_bytes_per_s(fw.par.num_gpus)
    return (pp - 1) * (hop + system.p2p_latency_s)


def _check(isl: int, osl: int, concurrency: float) -> None:
    require(isl >= 1, "isl", isl, "must be >= 1")
    require(osl >= 1, "osl", osl, "must be >= 1")
    require(concurrency > 0, "batch_size", concurrency, "client concurrency must be > 0")


def _kv_cap(fw: Forward, batch: float, context_len: float, what: str) -> tuple[float, list[str]]:
    """``batch`` capped at what one attention rank's KV pool holds, and a note when it binds."""
    cap = max_requests_per_rank(fw.model, fw.par, fw.prec, fw.kernels.system.gpu, context_len)
    if cap >= batch:
        return batch, []
    if cap < 1:
        return batch, [
            f"{what}: weights leave KV room for {cap:.2f} requests of {context_len:.0f} "
            "tokens per rank (cost/memory.py); predicted as if they fit"
        ]
    return float(math.floor(cap)), [
        f"{what}: the KV cache holds {math.floor(cap)} of {batch:g} requests per rank; the rest queue"
    ]


def predict_agg(fw: Forward, *, isl: int, osl: int, concurrency: float) -> Prediction:
    """Aggregated serving (see the module doc)."""
    _check(isl, osl, concurrency)
    fw.par.check(fw.model)
    pp = fw.par.pp
    clients = max(concurrency / fw.par.attention_dp, 1.0)
    b, notes = _kv_cap(fw, clients, isl + osl, "agg")
    budget = max(MAX_NUM_TOKENS - int(b), MAX_NUM_TOKENS // 4)  # decode tokens take their share
    chunks = math.ceil(isl / budget)
    group = 1.0 if chunks > 1 else min(b, float(max(1, budget // isl)))
    busy = (osl - 1) + chunks  # iterations a request is in the batch
    cycle = max(float(busy), b / group * chunks)  # prefill-bound when the groups need more
    decodes = b * (osl - 1) / cycle / pp  # decode tokens of one (micro-)batch iteration
    kv = isl + osl / 2
    own = StepTime()  # one group's prefill iterations (all its chunks) with the others' decodes
    own_s = 0.0
    for c in range(chunks):
        new = min(budget, isl - c * budget)
        st = fw.step(Step(ctx_requests=group, isl=new, prefix=c * budget, gen_requests=decodes, kv_len=kv))
        own_s += st.time_s + _pp_s(fw, group * new + decodes)
        _accumulate(own, st, 1.0)
    dec = fw.step(Step(gen_requests=decodes, kv_len=kv)) if decodes > 0 else StepTime()
    dec_s = dec.time_s + (_pp_s(fw, decodes) if decodes > 0 else 0.0)
    prefill_iters = b / group * chunks
    iteration_s = (b / group * own_s + (cycle - prefill_iters) * dec_s) / cycle  # the mean
    # a request decodes through the other groups' prefill iterations and the decode-only ones
    frac = (prefill_iters - chunks) / (cycle - chunks) if cycle > chunks else 0.0
    tpot_s = (frac * own_s / chunks + (1.0 - frac) * dec_s) if osl > 1 else 0.0
    tpot = StepTime()
    _accumulate(tpot, own, frac / chunks)
    _accumulate(tpot, dec, 1.0 - frac)
    # prefill-bound: the queue (cycle - busy iterations) already includes the arrival wait;
    # KV-bound: the clients beyond the pool wait (clients - b) / b cycles for a slot
    queue_s = (cycle - busy) * iteration_s + (clients - b) / b * cycle * iteration_s
    # the running iteration is only there to wait for when other groups are in flight
    arrival_s = ARRIVAL_WAIT_ITERATIONS * iteration_s if b > group else 0.0
    wait_s = max(arrival_s - queue_s, 0.0)
    ttft_s = own_s + queue_s + wait_s
    return Prediction(
        ttft_s=ttft_s,
        tpot_s=tpot_s,
        breakdown_ms={
            "ttft": _ms(
                own, {"wait_for_iteration": wait_s, "queue_wait": queue_s, "pp_p2p": own_s - own.time_s}
            ),
            "tpot": _ms(tpot, {"pp_p2p": tpot_s - tpot.time_s}) if osl > 1 else {},
            "batch": {
                "prefill_group": group,
                "prefill_iteration_share": frac,
                "decodes_per_iteration": decodes * pp,
                "running_per_rank": b,
            },
        },
        source=_sources(own, dec),
        notes=tuple(notes),
    )


def _accumulate(into: StepTime, step: StepTime, weight: float) -> None:
    for op, t in step.breakdown_s.items():
        into.breakdown_s[op] += weight * t
        into.sources[op] |= step.sources[op]


@dataclass(frozen=True, slots=True, kw_only=True)
class Pool:
    """``workers`` replicas of ``fw`` each running batches of up to ``batch`` requests."""

    fw: Forward
    batch: int
    workers: int

    def __post_init__(self) -> None:
        require(self.batch >= 1, "batch", self.batch, "must be >= 1")
        require(self.workers >= 1, "workers", self.workers, "must be >= 1")
        self.fw.par.check(self.fw.model)


def kv_transfer_s(prefill: Pool, decode: Pool, isl: int) -> float:
    """One request's KV from its prefill GPUs to its decode GPUs."""
    pfw, dfw = prefill.fw, decode.fw
    kv_bytes = 1.0 if pfw.prec.kv == "fp8" else 2.0
    per_token = pfw.model.kv_elements_per_token_layer * pfw.model.num_layers * kv_bytes
    system = pfw.kernels.system
    gpus = pfw.par.num_gpus + dfw.par.num_gpus
    lanes = min(pfw.par.tp * pfw.par.pp, dfw.par.tp * dfw.par.pp)  # KV is split by heads and layers
    if pfw.model.attention_kind == "mla":
        lanes = pfw.par.pp  # one latent per token: every TP rank holds it whole
    bandwidth = system.link_bytes_per_s(gpus) * KV_TRANSFER_EFFICIENCY * max(lanes, 1)
    return isl * per_token / bandwidth + system.p2p_latency_s


def predict_disagg(prefill: Pool, decode: Pool, *, isl: int, osl: int, concurrency: float) -> Prediction:
    """Disaggregated serving (see the module doc)."""
    _check(isl, osl, concurrency)
    pfw, dfw = prefill.fw, decode.fw
    kv = isl + osl / 2
    transfer_s = kv_transfer_s(prefill, decode, isl)

    def prefill_step(batch: float) -> tuple[StepTime, float]:
        ranks = pfw.par.attention_dp
        st = pfw.step(Step(ctx_requests=max(batch / ranks, 1.0), isl=isl))
        return st, st.time_s + _pp_s(pfw, max(batch / ranks, 1.0) * isl)

    def decode_step(batch: float) -> tuple[StepTime, float]:
        per_rank = max(batch / dfw.par.attention_dp, 1.0) / dfw.par.pp
        st = dfw.step(Step(gen_requests=per_rank, kv_len=kv))
        return st, st.time_s + _pp_s(dfw, per_rank)

    ranks = dfw.par.attention_dp
    per_rank, notes = _kv_cap(dfw, decode.batch / ranks, isl + osl, "decode")
    d_limit = min(float(decode.batch), per_rank * ranks)
    p_batch, d_batch, wait_s = float(prefill.batch), d_limit, 0.0
    for _ in range(FIXED_POINT_ROUNDS):
        p_st, p_s = prefill_step(p_batch)
        d_st, d_s = decode_step(d_batch)
        decode_s = (osl - 1) * (d_s if osl > 1 else 0.0)
        base_s = p_s + transfer_s
        prefill_rate = prefill.workers * p_batch / p_s  # requests/s the prefill workers finish
        decode_rate = decode.workers * d_limit / decode_s if decode_s > 0 else math.inf
        rate = concurrency / (base_s + wait_s + decode_s)  # closed loop at the current wait
        bound = min(prefill_rate, decode_rate)
        if concurrency / (base_s + decode_s) >= bound:  # saturated: Little's law sets the wait
            rate = bound
            wait_s = max(concurrency / rate - decode_s - base_s, 0.0)
        else:  # M/D/1 on the prefill workers
            rho = min(rate / prefill_rate, 0.99)
            wait_s = rho * p_s / (2.0 * (1.0 - rho))
        # batches fill only as far as requests arrive within one prefill
        p_batch = min(float(prefill.batch), max(1.0, rate * p_s / prefill.workers))
        d_batch = min(d_limit, max(1.0, rate * decode_s / decode.workers))
    p_st, p_s = prefill_step(p_batch)
    d_st, d_s = decode_step(d_batch)
    tpot_s = d_s if osl > 1 else 0.0
    ttft_s = wait_s + p_s + transfer_s
    return Prediction(
        ttft_s=ttft_s,
        tpot_s=tpot_s,
        breakdown_ms={
            "ttft": _ms(p_st, {"queue_wait": wait_s, "kv_transfer": transfer_s, "pp_p2p": p_s - p_st.time_s}),
            "tpot": _ms(d_st, {"pp_p2p": d_s - d_st.time_s}) if osl > 1 else {},
            "batch": {"prefill_batch": p_batch, "decode_batch": d_batch},
        },
        source=_sources(p_st, d_st),
        notes=tuple(notes),
    )

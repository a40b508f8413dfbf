"""Steady-state TTFT and TPOT of a deployment (``dualpath plan latency``), from cost/forward.py.

This module holds the prediction record, the helpers and disaggregated serving; aggregated
serving (the closed loop's iteration schedule) is in cost/latency_agg.py.

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
from dualpath.cost.latency_terms import KV_TRANSFER_EFFICIENCY
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
    details: dict[str, object] | None = None  # how it was predicted (method, scheduler defaults, run)

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
            **(self.details or {}),
        }


def _ms(step: StepTime, extra: dict[str, float] | None = None) -> dict[str, float]:
    out = {op: t * 1e3 for op, t in sorted(step.breakdown_s.items()) if t > 0}
    # a residual term (pp_p2p = stage time - compute) is rounding noise below a nanosecond
    out.update({k: (v * 1e3 if abs(v) > 1e-9 else 0.0) for k, v in (extra or {}).items()})
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
    """``batch`` capped at what one attention rank's KV pool holds, and a note when it binds. A
    pool below one request still runs one (the engine admits a request whose KV fits the pool
    only in part by paging, or the memory model is a little off); weights that leave no pool at
    all are predicted as if they fit (the measurement exists, so the memory estimate is wrong)."""
    cap = max_requests_per_rank(fw.model, fw.par, fw.prec, fw.kernels.system.gpu, context_len, fw.backend)
    if cap >= batch:
        return batch, []
    if cap <= 0:
        return batch, [
            f"{what}: the weights leave no KV room per rank (cost/memory.py); predicted as if they fit"
        ]
    if cap < 1:
        return 1.0, [
            f"{what}: weights leave KV room for {cap:.2f} requests of {context_len:.0f} "
            "tokens per rank (cost/memory.py); predicted as if one fits, the rest queue"
        ]
    return float(math.floor(cap)), [
        f"{what}: the KV cache holds {math.floor(cap)} of {batch:g} requests per rank; the rest queue"
    ]


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
    ranks = dfw.par.attention_dp
    per_rank, notes = _kv_cap(dfw, decode.batch / ranks, isl + osl, "decode")
    d_limit = min(float(decode.batch), per_rank * ranks)
    p_batch, d_batch, wait_s = _fixed_point(
        prefill, decode, isl=isl, osl=osl, concurrency=concurrency, transfer_s=transfer_s, d_limit=d_limit
    )
    p_st, p_s = _prefill_step(pfw, p_batch, isl)
    d_st, d_s = _decode_step(dfw, d_batch, kv)
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


def _prefill_step(pfw: Forward, batch: float, isl: int) -> tuple[StepTime, float]:
    """A prefill worker's step of ``batch`` prompts over its attention-DP ranks, and its seconds."""
    ranks = pfw.par.attention_dp
    st = pfw.step(Step(ctx_requests=max(batch / ranks, 1.0), isl=isl))
    return st, st.time_s + _pp_s(pfw, max(batch / ranks, 1.0) * isl)


def _decode_step(dfw: Forward, batch: float, kv: float) -> tuple[StepTime, float]:
    """A decode worker's step of ``batch`` requests at mean KV length ``kv``, and its seconds."""
    dp = dfw.par.attention_dp  # the busiest rank sets the pace (cost/latency_agg.py)
    per_rank = max(math.ceil(batch / dp - 1e-9) if dp > 1 else batch, 1.0) / dfw.par.pp
    st = dfw.step(Step(gen_requests=per_rank, kv_len=kv))
    return st, st.time_s + _pp_s(dfw, per_rank)


def _fixed_point(
    prefill: Pool,
    decode: Pool,
    *,
    isl: int,
    osl: int,
    concurrency: float,
    transfer_s: float,
    d_limit: float,
) -> tuple[float, float, float]:
    """The prefill batch, the decode batch and the queue wait the closed loop settles at."""
    pfw, dfw = prefill.fw, decode.fw
    kv = isl + osl / 2
    p_batch, d_batch, wait_s = float(prefill.batch), d_limit, 0.0
    for _ in range(FIXED_POINT_ROUNDS):
        _, p_s = _prefill_step(pfw, p_batch, isl)
        _, d_s = _decode_step(dfw, d_batch, kv)
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
    return p_batch, d_batch, wait_s

"""Disaggregated serving simulated: prefill workers, the KV hand-off, decode workers.

**Routing** (``ROUTER``). A request goes to the next prefill worker in turn and, once prefilled,
to the next decode worker in turn: Dynamo's frontend routes ``round-robin`` unless told otherwise
(its frontend configuration reference: ``--router-mode``, default ``round-robin``, "cycles through
workers"; the disaggregated rows here are Dynamo deployments). Inside a worker, the request goes
to the attention-DP rank with the fewest requests in hand (ties to the lowest index), as the
backend balances its own ranks; every ``attention_dp`` rank counts as an engine of its own (each
prefills or decodes its own requests). ``ROUTER = "least_loaded"`` balances the workers by load
instead (Dynamo's ``least-loaded`` / ``kv`` modes, not their default). A prefill rank is an engine (latency/engine.py)
that runs prompts only, at most ``prefill_batch`` at once (the row's ``prefill_batch_size``; the
backend's own limit when empty), under the backend's token budget. When a prompt is in, its KV
goes to the decode rank routing picks: ``isl`` tokens of KV over the link between the two
workers (cost/latency.py ``kv_transfer_s``: NVLink inside the node, else the network, at
``KV_TRANSFER_EFFICIENCY``, split over the lanes both sides hold), one transfer at a time per
prefill rank. A decode rank holds at most ``decode_batch / attention_dp`` requests; one that
arrives is admitted when a slot and its KV fit and emits its first token with its first decode
step: TTFT = prefill queue + prefill + hand-off + decode queue + first decode step, as the
client sees it. TensorRT-LLM context servers run without the overlap scheduler (its
disaggregated-serving examples set ``disable_overlap_scheduler: true`` on them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from dualpath.core.errors import require
from dualpath.cost.deployment import Deployment, Layout
from dualpath.cost.forward import Forward
from dualpath.cost.latency import Pool, Prediction, _sources, kv_transfer_s
from dualpath.latency.benchmark import ClosedLoop, summarize
from dualpath.latency.engine import Engine
from dualpath.latency.ranks import defaults_for, kv_capacity_tokens, memoised
from dualpath.latency.requests import Req
from dualpath.latency.steps import step_cost
from dualpath.sim.kernel import PRIO_ARRIVAL, Kernel

ROUTERS = ("round_robin", "least_loaded")
ROUTER = "round_robin"  # Dynamo frontend's --router-mode default (module doc)


class Disagg:
    """The prefill and decode ranks of one deployment and the hand-off between them."""

    def __init__(self, kernel: Kernel, dep: Deployment, forward: Callable[[Layout, str], Forward]) -> None:
        self.kernel = kernel
        pfw = memoised(forward(dep.prefill, "prefill_"))
        dfw = memoised(forward(dep.decode, "decode_"))
        pfw.par.check(pfw.model)
        dfw.par.check(dfw.model)
        self.isl, self.osl = dep.isl, dep.osl
        decode_batch = dep.decode_batch or max(1, math.ceil(dep.batch_size / dep.decode_workers))
        p_def = defaults_for(dep, pfw, "prefill", dep.prefill_batch or 1)
        d_def = defaults_for(dep, dfw, "decode", decode_batch)
        if dep.backend == "trtllm":
            p_def = replace(p_def, overlap=False)
        if dep.prefill_batch:
            p_def = replace(p_def, max_running=max(1, math.ceil(dep.prefill_batch / pfw.par.attention_dp)))
        d_def = replace(d_def, max_running=max(1, math.ceil(decode_batch / dfw.par.attention_dp)))
        self.defaults = {"prefill": p_def, "decode": d_def}
        p_cap, p_notes = kv_capacity_tokens(pfw, dep.isl, 1)
        d_cap, d_notes = kv_capacity_tokens(dfw, dep.isl, dep.osl)
        self.notes = [f"prefill: {n}" for n in p_notes] + [f"decode: {n}" for n in d_notes]
        self.p_cost, self.d_cost = step_cost(pfw, dep.isl, 1), step_cost(dfw, dep.isl, dep.osl)
        n_p = dep.prefill_workers * pfw.par.attention_dp
        n_d = dep.decode_workers * dfw.par.attention_dp
        self.prefill = [Engine(kernel, p_def, self.p_cost, p_cap, self._prefilled) for _ in range(n_p)]
        self.decode = [Engine(kernel, d_def, self.d_cost, d_cap, self._decoded) for _ in range(n_d)]
        self.transfer_s = kv_transfer_s(
            Pool(fw=pfw, batch=1, workers=1), Pool(fw=dfw, batch=1, workers=1), dep.isl
        )
        self._width = {"prefill": pfw.par.attention_dp, "decode": dfw.par.attention_dp}
        self._turn = {"prefill": 0, "decode": 0}
        self._link_free_s = [0.0] * n_p
        self._origin: dict[int, tuple[Req, int]] = {}
        self._times: dict[int, dict[str, float]] = {}
        self.loop: ClosedLoop | None = None

    @staticmethod
    def _least_loaded(engines: list[Engine], first: int = 0) -> int:
        loads = [len(e.q.running) + len(e.q.waiting) for e in engines]
        return first + loads.index(min(loads))

    def _route(self, side: str, engines: list[Engine], router: str = "") -> int:
        """The rank ``side``'s next request goes to (module doc, Routing)."""
        router = router or ROUTER
        require(router in ROUTERS, "router", router, f"choices: {', '.join(ROUTERS)}")
        if router == "least_loaded":
            return self._least_loaded(engines)
        width = self._width[side]
        worker = self._turn[side] % (len(engines) // width)
        self._turn[side] += 1
        return self._least_loaded(engines[worker * width : (worker + 1) * width], worker * width)

    def send(self, req: Req) -> None:
        """A client's request: prefill it (the prompt only: one output token's worth)."""
        rank = self._route("prefill", self.prefill)
        stage = Req(rid=req.rid, client=req.client, isl=req.isl, osl=1, arrival_s=req.arrival_s)
        self._origin[id(stage)] = (req, rank)
        self._times[req.rid] = {"sent": req.sent_s}
        self.prefill[rank].submit(stage)

    def _prefilled(self, stage: Req) -> None:
        req, rank = self._origin.pop(id(stage))
        now = self.kernel.now_s
        times = self._times[req.rid]
        times["prefill_start"] = stage.first_scheduled_s if stage.first_scheduled_s is not None else now
        times["prefill_done"] = now
        start = max(now, self._link_free_s[rank])
        self._link_free_s[rank] = start + self.transfer_s
        self.kernel.call_at(start + self.transfer_s, lambda: self._hand_off(req), PRIO_ARRIVAL)

    def _hand_off(self, req: Req) -> None:
        now = self.kernel.now_s
        self._times[req.rid]["decode_arrival"] = now
        arrived = Req(
            rid=req.rid, client=req.client, isl=self.isl, osl=self.osl, arrival_s=now, sent_s=req.sent_s
        )
        arrived.computed = arrived.kv = self.isl
        self.decode[self._route("decode", self.decode)].submit(arrived)

    def _decoded(self, req: Req) -> None:
        assert self.loop is not None
        self.loop.done(req)

    def breakdown_ms(self, reqs: list[Req]) -> dict[str, float]:
        """Mean TTFT parts over ``reqs`` (ms); they add up to the mean TTFT."""
        parts = {"prefill_queue": 0.0, "prefill": 0.0, "kv_transfer": 0.0, "decode_queue_and_first_step": 0.0}
        for r in reqs:
            t = self._times[r.rid]
            assert r.first_token_s is not None
            parts["prefill_queue"] += t["prefill_start"] - t["sent"]
            parts["prefill"] += t["prefill_done"] - t["prefill_start"]
            parts["kv_transfer"] += t["decode_arrival"] - t["prefill_done"]
            parts["decode_queue_and_first_step"] += r.first_token_s - t["decode_arrival"]
        return {k: v / len(reqs) * 1e3 for k, v in parts.items()}


def simulate_disagg(
    dep: Deployment, forward: Callable[[Layout, str], Forward], *, requests_per_client: int
) -> Prediction:
    """The benchmark of a disaggregated ``dep`` (see the module doc)."""
    require(dep.prefill_workers >= 1, "prefill_num_workers", dep.prefill_workers, "must be >= 1")
    require(dep.decode_workers >= 1, "decode_num_workers", dep.decode_workers, "must be >= 1")
    kernel = Kernel()
    clients = max(1, round(dep.batch_size))
    system = Disagg(kernel, dep, forward)
    loop = ClosedLoop(
        kernel, isl=dep.isl, osl=dep.osl, clients=clients, requests_per_client=requests_per_client
    )
    system.loop = loop
    loop.send = system.send
    loop.start()
    end_s = kernel.run()
    expected = clients * requests_per_client
    require(len(loop.finished) == expected, "requests", len(loop.finished), f"the run finished of {expected}")
    iterations = sum(e.iterations for e in system.prefill + system.decode)
    run = summarize(loop.finished, dep.osl, iterations, end_s, clients)
    ttft = system.breakdown_ms(loop.finished)
    stall_ms = run.stall_s * 1e3
    return Prediction(
        ttft_s=run.ttft_s,
        tpot_s=run.tpot_s,
        breakdown_ms={
            "ttft": ttft,
            "tpot": {"decode_iterations": run.tpot_s * 1e3 - stall_ms, "iterations_with_prompts": stall_ms},
            "batch": {**run.to_json(), "kv_transfer_ms_each": system.transfer_s * 1e3},
        },
        source=_sources(*system.p_cost.steps, *system.d_cost.steps),
        notes=tuple(system.notes),
        details={
            "method": "simulation",
            "scheduler": {k: v.to_json() for k, v in system.defaults.items()},
            "prefill_ranks": len(system.prefill),
            "decode_ranks": len(system.decode),
            "requests_per_client": requests_per_client,
            "assumed": list(dep.assumed),
        },
    )

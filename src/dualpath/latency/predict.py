"""TTFT / TPOT of a deployment as its benchmark measures them: the run simulated (module docs of
latency/benchmark.py, engine.py, disagg.py), with the scheduler defaults it used in ``details``.

Aggregated: one attention rank serves the busiest rank's ``ceil(concurrency / attention_dp)``
clients (the ranks meet at every MoE gather, so the busiest sets the pace, as in the closed
form). Its KV pool (cost/memory.py, the backend's sizing rule) in tokens is the requests of
``isl + osl`` tokens it holds times their length.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from dualpath.core.errors import require
from dualpath.cost.deployment import Deployment, forward_for
from dualpath.cost.latency import Prediction, _sources
from dualpath.latency.benchmark import REQUESTS_PER_CLIENT, RunResult, run_agg
from dualpath.latency.ranks import defaults_for, kv_capacity_tokens, memoised
from dualpath.latency.steps import StepCost, step_cost


def _prediction(run: RunResult, cost: StepCost, details: dict[str, object], notes: list[str]) -> Prediction:
    decode_ms = (run.tpot_s - run.stall_s) * 1e3
    return Prediction(
        ttft_s=run.ttft_s,
        tpot_s=run.tpot_s,
        breakdown_ms={
            "ttft": {"wait_before_prefill": run.wait_s * 1e3, "prefill_iterations": run.prefill_s * 1e3},
            "tpot": {"decode_iterations": decode_ms, "iterations_with_prompts": run.stall_s * 1e3},
            "batch": run.to_json(),
        },
        source=_sources(*cost.steps),
        notes=tuple(notes),
        details=details,
    )


def simulate(
    dep: Deployment,
    data_dir: str | Path | None = None,
    *,
    requests_per_client: int = REQUESTS_PER_CLIENT,
) -> Prediction:
    """The benchmark of ``dep`` simulated; ConfigError naming the value that does not fit."""
    require(dep.isl >= 1, "isl", dep.isl, "must be >= 1")
    require(dep.osl >= 1, "osl", dep.osl, "must be >= 1")
    require(dep.batch_size >= 1, "batch_size", dep.batch_size, "client concurrency must be >= 1")
    kernels, forward = forward_for(dep, data_dir)
    if dep.mode == "disagg":
        from dualpath.latency.disagg import simulate_disagg

        pred = simulate_disagg(dep, forward, requests_per_client=requests_per_client)
        return _with_tables(pred, kernels.describe())
    fw = memoised(forward(dep.layout, ""))
    fw.par.check(fw.model)
    defaults = defaults_for(dep, fw)
    clients = max(1, math.ceil(dep.batch_size / fw.par.attention_dp - 1e-9))
    capacity, notes = kv_capacity_tokens(fw, dep.isl, dep.osl)
    if capacity < clients * (dep.isl + dep.osl):
        notes.append(
            f"the KV pool holds {capacity / (dep.isl + dep.osl):.1f} of {clients} requests per rank; "
            "the rest queue"
        )
    cost = step_cost(fw, dep.isl, dep.osl)
    run = run_agg(cost, defaults, capacity, clients=clients, requests_per_client=requests_per_client)
    details: dict[str, object] = {
        "method": "simulation",
        "scheduler": defaults.to_json(),
        "clients_per_rank": clients,
        "requests_per_client": requests_per_client,
        "assumed": list(dep.assumed),
    }
    return _with_tables(_prediction(run, cost, details, notes + list(defaults.notes)), kernels.describe())


def _with_tables(pred: Prediction, tables: dict[str, str]) -> Prediction:
    return replace(pred, tables=tables)

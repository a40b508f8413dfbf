"""What one planner run is given and returns, and the invariants checked at its end."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dualpath.planner.links import D2D_GBS, N2N_GBS, link_bytes
from dualpath.planner.pools import AF_PREFILL_DEFAULT, af_crossings
from dualpath.sim.kernel import SimulationError
from dualpath.sim.links import check_utilisation

if TYPE_CHECKING:
    from dualpath.planner.run import _Run


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """Constants of one run (every one is reported in the plan's ``constants``)."""

    prefill_token_budget: int = 16384
    max_decode_batch: int = 512
    af_microbatches: int = 2
    link_latency_s: float = 0.0
    n2n_gbs: float = N2N_GBS
    d2d_gbs: float = D2D_GBS
    budget: float = math.inf
    budget_kind: str = "power_w"
    af_prefill: str = AF_PREFILL_DEFAULT  # pools.AF_PREFILL_RULES
    nd_schedule: str = "prefill-first"  # schedule.ND_SCHEDULES


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    makespan_s: float
    tokens_per_s: float
    output_tokens_per_s: float
    n2n_bytes: float
    kv_handoff_bytes: float
    af_bytes: float
    num_events: int
    pool_busy_s: dict[str, float]
    kv_capacity_bytes: float
    max_kv_used_bytes: float
    num_finished: int


def check_invariants(run: _Run) -> RunResult:
    """The section-5 invariants of a finished run (raise ``SimulationError`` when one breaks):
    every request finished, the budget holds, every pool holds its weights, the KV admitted never
    exceeded the capacity, the N2N bytes equal the KV hand-off bytes plus
    ``crossings x tokens x (act_A + act_F)`` of every A/F boundary (decode: one crossing per layer;
    prefill: ``pools.af_crossings`` of the run's ``af_prefill`` rule; computed from the request
    list, not from the run), and no link was busier than the run was long."""
    reqs, model, alloc, k = run.reqs, run.model, run.alloc, run.k
    now = k.now_s

    def fail(msg: str) -> SimulationError:
        return SimulationError(now, f"{run.mode.name}: {msg}")

    if run.num_done != len(reqs) or any(math.isnan(t) for t in run.done_s):
        raise fail(f"{len(reqs) - run.num_done} of {len(reqs)} requests did not finish")
    if alloc.cost > run.cfg.budget * (1 + 1e-9):
        raise fail(f"allocation costs {alloc.cost} > budget {run.cfg.budget}")
    for pool in alloc.pools:
        if pool.weights_per_device(model) > pool.device.device.capacity_bytes:
            raise fail(f"pool {pool.name} cannot hold its weights")
    if run.max_kv > run.kv_cap * (1 + 1e-12):
        raise fail(f"KV admitted {run.max_kv} exceeds capacity {run.kv_cap}")
    kv_expected = sum(run._handoff_bytes(r) for r in range(len(reqs))) if run.has_kv_boundary else 0.0
    af_expected = 0.0
    crossings = {"prefill": af_crossings(run.cfg.af_prefill, model.num_layers), "decode": model.num_layers}
    for u in run.units.values():
        if u.unit.is_split:
            for phase in u.unit.phases:
                tokens = sum(reqs.input_len if phase == "prefill" else reqs.output_len)
                af_expected += crossings[phase] * tokens * (u.act_a[phase] + u.act_f[phase])
    links = run.all_links()
    moved = link_bytes(links)
    expected = kv_expected + af_expected
    if abs(moved - expected) > 1e-9 * max(expected, 1.0):
        raise fail(f"N2N bytes {moved} != KV hand-off {kv_expected} + AF {af_expected}")
    makespan = max(run.done_s)
    check_utilisation(links, makespan)
    out_tokens = sum(reqs.output_len)
    return RunResult(
        makespan_s=makespan,
        tokens_per_s=reqs.total_tokens / makespan,
        output_tokens_per_s=out_tokens / makespan,
        n2n_bytes=moved,
        kv_handoff_bytes=kv_expected,
        af_bytes=af_expected,
        num_events=k.events,
        pool_busy_s=dict(run.busy),
        kv_capacity_bytes=run.kv_cap,
        max_kv_used_bytes=run.max_kv,
        num_finished=run.num_done,
    )

"""The planner's entry point: ``plan_disagg(PlanConfig) -> dict`` (``plan disagg --json``).

For each mode: phase 1 short-lists candidates per pool, phase 2 ranks budget splits, the top K are
run end to end (run.py) and the best simulated tokens/s is kept. ``x_nd`` compares every mode with
ND's best on the identical request list. The result carries every constant used.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dualpath.core.errors import ConfigError
from dualpath.cost.efficiency import get_efficiency
from dualpath.cost.stages import STAGES
from dualpath.planner.ablation import apply_overrides
from dualpath.planner.budget import Budget, budget_kind, resolve_budget
from dualpath.planner.budget_demand import DemandAnchor, demand_anchor
from dualpath.planner.catalog import catalog as load_catalog
from dualpath.planner.config import PlanConfig, allowed_precision
from dualpath.planner.links import n2n_bytes_per_s
from dualpath.planner.modes import MODES, mode_spec
from dualpath.planner.plan_json import constants, mode_json
from dualpath.planner.pools import af_crossings
from dualpath.planner.run import RunConfig, RunResult, makespan_lower_bound, simulate
from dualpath.planner.search import Counts, Demand
from dualpath.planner.search_allocate import phase2
from dualpath.planner.search_fill import Coupling
from dualpath.planner.search_shortlist import phase1
from dualpath.planner.stage_profile import stage_profile_of
from dualpath.planner.windows import context_report
from dualpath.planner.workloads import Requests, make_requests
from dualpath.spec.models import get_model

if TYPE_CHECKING:
    from dualpath.cost.efficiency import Efficiency
    from dualpath.planner.modes import ModeSpec
    from dualpath.planner.pools import Allocation
    from dualpath.spec.device import Device
    from dualpath.spec.models import ModelSpec


def plan_disagg(config: PlanConfig, progress: Callable[[str], None] | None = None) -> dict:
    """Search every mode of ``config`` and return the section-9 JSON object."""
    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    base = get_model(config.model)
    model = apply_overrides(base, dict(config.overrides)) if config.overrides else base
    devices = load_catalog(config.catalog, config.prices)
    efficiency = get_efficiency(config.efficiency)
    reqs = requests_of(config, config.io_ratio)
    demand = demand_of(reqs, config.rate_rps)
    budget = _budget(config, base, devices, reqs, efficiency)
    allowed = allowed_precision(config)
    run_cfg = _run_config(config, budget)
    counts = Counts()
    shortlists: dict[tuple[str, ...], list] = {}
    best: dict[str, tuple[RunResult, Allocation] | None] = {}
    modes = config.modes if "nd" in config.modes else ("nd", *config.modes)
    ctx = _Search(config, model, devices, demand, allowed, budget, efficiency, counts, shortlists, say)
    for name in modes:
        best[name] = ctx.best_of(name, reqs, run_cfg)
    if best["nd"] is None:
        raise ConfigError(
            "budget",
            budget.value,
            f"no ND deployment of {config.model} fits "
            f"the {budget.kind} budget on the {config.catalog} catalogue",
        )
    nd_run, nd_alloc = best["nd"]
    nd_tps = nd_run.tokens_per_s
    out_modes = {}
    for m in config.modes:
        found = best[m]
        out_modes[m] = mode_json(
            found[0] if found else None, found[1] if found else None, nd_tps, budget.kind
        )
    best_mode = _best_mode(config.modes, best)
    precision, chosen_devices = _winner_stages(best[best_mode][1], allowed)  # type: ignore[index]
    profile = stage_profile_of(
        model,
        demand.input_len,
        demand.output_len,
        precision,
        chosen_devices,
        config.prefill_token_budget,
        efficiency,
    )
    return {
        "model": config.model,
        "catalog": config.catalog,
        "io_ratio": float(config.io_ratio),
        "workload": _workload_json(config, reqs),
        "budget": budget.to_json(),
        "overrides": dict(config.overrides),
        "precision": precision,
        "modes": out_modes,
        "best_mode": best_mode,
        "stage_profile": profile,
        "nd_sigma": nd_alloc.sigma_joint,
        "arrival_window_s": reqs.arrival_s[-1],
        "arrival_bound_ceiling": nd_run.makespan_s / reqs.arrival_s[-1] if reqs.arrival_s[-1] > 0 else None,
        "context": context_report(
            config.model, [i + o for i, o in zip(reqs.input_len, reqs.output_len, strict=True)]
        ),
        "search": counts.to_json(config.top_k),
        "constants": constants(config, budget, devices),
        "wall_s": time.perf_counter() - started,
    }


def _run_config(config: PlanConfig, budget: Budget) -> RunConfig:
    """The run rules of every simulated allocation of one plan."""
    return RunConfig(
        prefill_token_budget=config.prefill_token_budget,
        max_decode_batch=config.max_decode_batch,
        af_microbatches=config.af_microbatches,
        link_latency_s=config.link_latency_us * 1e-6,
        n2n_gbs=config.n2n_gbs,
        budget=budget.value,
        budget_kind=budget.kind,
        af_prefill=config.af_prefill,
        nd_schedule=config.nd_schedule,
    )


def _best_mode(modes: tuple[str, ...], best: dict[str, tuple[RunResult, Allocation] | None]) -> str:
    """The feasible mode with the most simulated tokens/s (ties: the earlier in ``MODES``)."""
    feasible = [m for m in modes if best[m] is not None]
    return max(
        feasible,
        key=lambda m: (
            best[m][0].tokens_per_s,  # type: ignore[index]
            -MODES.index(m),
        ),
    )


def _winner_stages(
    winner: Allocation, allowed: dict[str, tuple[int, ...]]
) -> tuple[dict[str, int], dict[str, Device]]:
    """Each stage's precision (default: its first allowed) and device in the winning allocation."""
    precision: dict[str, int] = {s: allowed[s][0] for s in STAGES}
    chosen_devices: dict[str, Device] = {}
    for chosen in winner.pools:
        for s in chosen.stages:
            precision[s] = chosen.bits_map[s]
            chosen_devices[s] = chosen.device.device
    return precision, chosen_devices


def _workload_json(config: PlanConfig, reqs: Requests) -> dict:
    """The WORKLOAD object: the config's workload and the request list's mean lengths."""
    return {
        "kind": config.workload,
        "num_requests": config.num_requests,
        "rate_rps": config.rate_rps,
        "input_len": _round(reqs.mean_input),
        "output_len": _round(reqs.mean_output),
        "length_cv": config.length_cv,
        "seed": config.seed,
        "arrivals": config.arrivals,
    }


@dataclass(slots=True)
class _Search:
    """One plan's search state: the short lists are shared by the modes whose pools host the same
    stages (mutated: ``shortlists``, ``counts``)."""

    config: PlanConfig
    model: ModelSpec
    devices: tuple
    demand: Demand
    allowed: dict[str, tuple[int, ...]]
    budget: Budget
    efficiency: Efficiency
    counts: Counts
    shortlists: dict[tuple[str, ...], list]
    say: Callable[[str], None]

    def lists(self, spec: ModeSpec) -> dict[str, list]:
        config, out = self.config, {}
        for pool in spec.pools:
            if pool.stages not in self.shortlists:
                self.say(f"{spec.name}: phase 1, pool {pool.name}")
                self.shortlists[pool.stages] = phase1(
                    self.model,
                    pool,
                    self.devices,
                    self.demand,
                    self.allowed,
                    budget=self.budget.value,
                    budget_kind=self.budget.kind,
                    efficiency=self.efficiency,
                    prefill_token_budget=config.prefill_token_budget,
                    max_decode_batch=config.max_decode_batch,
                    shortlist=config.shortlist,
                    counts=self.counts,
                    sigma_rule=config.sigma,
                )
            out[pool.name] = self.shortlists[pool.stages]
        return out

    def best_of(self, name: str, reqs: Requests, run_cfg: RunConfig) -> tuple[RunResult, Allocation] | None:
        """Phase 1 and 2 of mode ``name``, its top K simulated; the best by tokens/s (None: no
        allocation fits the budget)."""
        config, spec = self.config, mode_spec(name)
        coupling = (
            _coupling(spec, config, self.model, self.demand) if config.sigma == "partner-batch" else None
        )
        ranked = phase2(
            spec,
            self.lists(spec),
            budget=self.budget.value,
            grid=config.grid,
            counts=self.counts,
            coupling=coupling,
        )
        top: tuple[RunResult, Allocation] | None = None
        for i, alloc in enumerate(ranked[: config.top_k]):
            self.say(f"{name}: simulating {i + 1}/{min(config.top_k, len(ranked))}")
            until = top[0].makespan_s if top is not None else math.inf
            if (
                until < math.inf
                and makespan_lower_bound(self.model, spec, alloc, reqs, run_cfg, self.efficiency) >= until
            ):
                self.counts.skipped += 1  # cannot finish before the best so far: not simulated
                continue
            result = simulate(self.model, spec, alloc, reqs, run_cfg, self.efficiency, until_s=until)
            self.counts.simulated += 1
            if result is None:  # stopped once it could no longer beat the best so far
                self.counts.stopped += 1
                continue
            self.counts.events += result.num_events
            if top is None or result.tokens_per_s > top[0].tokens_per_s:
                top = (result, alloc)
        return top


def requests_of(config: PlanConfig, io_ratio: float) -> Requests:
    """The plan's request list at ``io_ratio`` (the other fields from ``config``)."""
    return make_requests(
        workload=config.workload,
        num_requests=config.num_requests,
        rate_rps=config.rate_rps,
        io_ratio=io_ratio,
        output_len=config.output_len,
        length_cv=config.length_cv,
        seed=config.seed,
        arrivals=config.arrivals,
    )


def demand_of(reqs: Requests, rate_rps: float) -> Demand:
    """What a request list arriving at ``rate_rps`` asks of the pools (its means and longest
    context)."""
    return Demand(
        rate_rps=rate_rps,
        input_len=reqs.mean_input,
        output_len=reqs.mean_output,
        max_context_len=max(i + o for i, o in zip(reqs.input_len, reqs.output_len, strict=True)),
        num_requests=len(reqs),
    )


def _budget(
    config: PlanConfig, base: ModelSpec, devices: tuple, reqs: Requests, efficiency: Efficiency
) -> Budget:
    demand: tuple[float, str, float | None, float] | None = None
    explicit = config.budget_w is not None or config.budget_usd_hr is not None
    if config.budget_anchor == "demand" and not explicit:
        ref = config.reference_io
        ref_reqs = reqs if ref == config.io_ratio or config.workload != "io" else requests_of(config, ref)
        got = _anchor(config, base, devices, demand_of(ref_reqs, config.rate_rps), efficiency)
        demand = (got.cost, got.reference, ref if config.workload == "io" else None, got.sigma)
    return resolve_budget(
        base,
        devices,
        config.catalog,
        budget_w=config.budget_w,
        budget_usd_hr=config.budget_usd_hr,
        budget_scale=config.scale,
        demand=demand,
    )


_ANCHORS: dict[tuple, DemandAnchor] = {}


def _anchor(
    config: PlanConfig, base: ModelSpec, devices: tuple, demand: Demand, efficiency: Efficiency
) -> DemandAnchor:
    """budget_demand.demand_anchor, memoised per process (a sweep plans each model at many ratios
    against one anchor)."""
    key = (
        base.name,
        config.catalog,
        str(config.prices),
        demand,
        config.efficiency,
        config.prefill_token_budget,
        config.max_decode_batch,
        config.sigma,
    )
    got = _ANCHORS.get(key)
    if got is None:
        got = _ANCHORS[key] = demand_anchor(
            base,
            devices,
            budget_kind(config.catalog),
            demand,
            efficiency=efficiency,
            prefill_token_budget=config.prefill_token_budget,
            max_decode_batch=config.max_decode_batch,
            sigma_rule=config.sigma,
        )
    return got


def _coupling(spec: ModeSpec, config: PlanConfig, model: ModelSpec, demand: Demand) -> Coupling:
    return Coupling.of(
        spec,
        concurrency=demand.num_requests,
        max_decode_batch=config.max_decode_batch,
        microbatches=config.af_microbatches,
        n2n_bps=n2n_bytes_per_s(1, 1, config.n2n_gbs),
        latency_s=config.link_latency_us * 1e-6,
        prefill_crossings=af_crossings(config.af_prefill, model.num_layers),
        decode_crossings=model.num_layers,
        demand_prefill_tps=demand.prefill_tokens_per_s,
        demand_decode_tps=demand.decode_tokens_per_s,
    )


def _round(x: float) -> float | int:
    return int(round(x)) if abs(x - round(x)) < 1e-9 else x

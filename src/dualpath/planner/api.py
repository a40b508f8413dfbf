"""The planner's entry point: ``plan_disagg(PlanConfig) -> dict`` (``plan disagg --json``).

For each mode: phase 1 short-lists candidates per pool, phase 2 ranks budget splits, the top K are
run end to end (run.py) and the best simulated tokens/s is kept. ``x_nd`` compares every mode with
ND's best on the identical request list. The result carries every constant used.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from dualpath.core.errors import ConfigError
from dualpath.cost.efficiency import get_efficiency
from dualpath.cost.stages import STAGES
from dualpath.planner.ablation import apply_overrides
from dualpath.planner.budget import resolve_budget
from dualpath.planner.catalog import catalog as load_catalog
from dualpath.planner.config import PlanConfig, allowed_precision
from dualpath.planner.modes import MODES, mode_spec
from dualpath.planner.plan_json import constants, mode_json
from dualpath.planner.run import RunConfig, RunResult, simulate
from dualpath.planner.search import Counts, Demand
from dualpath.planner.search_allocate import phase2
from dualpath.planner.search_shortlist import phase1
from dualpath.planner.stage_profile import stage_profile_of
from dualpath.planner.workloads import make_requests
from dualpath.spec.models import get_model

if TYPE_CHECKING:
    from dualpath.planner.pools import Allocation
    from dualpath.spec.device import Device


def plan_disagg(config: PlanConfig, progress: Callable[[str], None] | None = None) -> dict:
    """Search every mode of ``config`` and return the section-9 JSON object."""
    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    base = get_model(config.model)
    model = apply_overrides(base, dict(config.overrides)) if config.overrides else base
    devices = load_catalog(config.catalog, config.prices)
    budget = resolve_budget(
        base,
        devices,
        config.catalog,
        budget_w=config.budget_w,
        budget_usd_hr=config.budget_usd_hr,
        budget_scale=config.budget_scale,
    )
    allowed = allowed_precision(config)
    reqs = make_requests(
        workload=config.workload,
        num_requests=config.num_requests,
        rate_rps=config.rate_rps,
        io_ratio=config.io_ratio,
        output_len=config.output_len,
        length_cv=config.length_cv,
        seed=config.seed,
        arrivals=config.arrivals,
    )
    demand = Demand(
        rate_rps=config.rate_rps,
        input_len=reqs.mean_input,
        output_len=reqs.mean_output,
        max_context_len=max(i + o for i, o in zip(reqs.input_len, reqs.output_len, strict=True)),
        num_requests=len(reqs),
    )
    efficiency = get_efficiency(config.efficiency)
    run_cfg = RunConfig(
        prefill_token_budget=config.prefill_token_budget,
        max_decode_batch=config.max_decode_batch,
        af_microbatches=config.af_microbatches,
        link_latency_s=config.link_latency_us * 1e-6,
        n2n_gbs=config.n2n_gbs,
        budget=budget.value,
        budget_kind=budget.kind,
    )
    counts = Counts()
    shortlists: dict[tuple[str, ...], list] = {}
    best: dict[str, tuple[RunResult, Allocation] | None] = {}
    modes = config.modes if "nd" in config.modes else ("nd", *config.modes)
    for name in modes:
        spec = mode_spec(name)
        lists = {}
        for pool in spec.pools:
            if pool.stages not in shortlists:
                say(f"{name}: phase 1, pool {pool.name}")
                shortlists[pool.stages] = phase1(
                    model,
                    pool,
                    devices,
                    demand,
                    allowed,
                    budget=budget.value,
                    budget_kind=budget.kind,
                    efficiency=efficiency,
                    prefill_token_budget=config.prefill_token_budget,
                    max_decode_batch=config.max_decode_batch,
                    shortlist=config.shortlist,
                    counts=counts,
                    sigma_rule=config.sigma,
                )
            lists[pool.name] = shortlists[pool.stages]
        ranked = phase2(
            spec,
            lists,
            budget=budget.value,
            grid=config.grid,
            counts=counts,
            sigma_rule=config.sigma,
            n2n_gbs=config.n2n_gbs,
        )
        top: tuple[RunResult, Allocation] | None = None
        for i, alloc in enumerate(ranked[: config.top_k]):
            say(f"{name}: simulating {i + 1}/{min(config.top_k, len(ranked))}")
            result = simulate(model, spec, alloc, reqs, run_cfg, efficiency)
            counts.simulated += 1
            counts.events += result.num_events
            if top is None or result.tokens_per_s > top[0].tokens_per_s:
                top = (result, alloc)
        best[name] = top
    if best["nd"] is None:
        raise ConfigError(
            "budget",
            budget.value,
            f"no ND deployment of {config.model} fits "
            f"the {budget.kind} budget on the {config.catalog} catalogue",
        )
    nd_tps = best["nd"][0].tokens_per_s
    out_modes = {}
    for m in config.modes:
        found = best[m]
        out_modes[m] = mode_json(
            found[0] if found else None, found[1] if found else None, nd_tps, budget.kind
        )
    feasible = [m for m in config.modes if best[m] is not None]
    best_mode = max(
        feasible,
        key=lambda m: (
            best[m][0].tokens_per_s,  # type: ignore[index]
            -MODES.index(m),
        ),
    )
    precision: dict[str, int] = {s: allowed[s][0] for s in STAGES}
    winner = best[best_mode][1]  # type: ignore[index]
    chosen_devices: dict[str, Device] = {}
    for chosen in winner.pools:
        for s in chosen.stages:
            precision[s] = chosen.bits_map[s]
            chosen_devices[s] = chosen.device.device
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
        "workload": {
            "kind": config.workload,
            "num_requests": config.num_requests,
            "rate_rps": config.rate_rps,
            "input_len": _round(reqs.mean_input),
            "output_len": _round(reqs.mean_output),
            "length_cv": config.length_cv,
            "seed": config.seed,
            "arrivals": config.arrivals,
        },
        "budget": budget.to_json(),
        "overrides": dict(config.overrides),
        "precision": precision,
        "modes": out_modes,
        "best_mode": best_mode,
        "stage_profile": profile,
        "search": counts.to_json(config.top_k),
        "constants": constants(config, budget, devices),
        "wall_s": time.perf_counter() - started,
    }


def _round(x: float) -> float | int:
    return int(round(x)) if abs(x - round(x)) < 1e-9 else x

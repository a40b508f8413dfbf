"""The JSON shaping of ``plan disagg --json``: one mode's MODE object and the constants a plan used."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dualpath.planner.links import D2D_DOMAIN, D2D_GBS
from dualpath.planner.parallel import DECODE_CTX_GRID, PP_DEGREES, TP_DEGREES
from dualpath.planner.power import power_fit
from dualpath.planner.stage_profile import PROFILE_DECODE_BATCH
from dualpath.planner.workloads import AGENTIC_MAXLEN

if TYPE_CHECKING:
    from dualpath.planner.catalog import CatalogDevice
    from dualpath.planner.config import PlanConfig
    from dualpath.planner.pools import Allocation
    from dualpath.planner.run import RunResult


def mode_json(
    result: RunResult | None, alloc: Allocation | None, nd_tps: float, kind: str
) -> dict[str, object]:
    """The issue's MODE object (``feasible`` False: no allocation fits the budget)."""
    if result is None or alloc is None:
        return {
            "x_nd": 0.0,
            "tokens_per_s": 0.0,
            "output_tokens_per_s": 0.0,
            "makespan_s": 0.0,
            "sigma_joint": 0.0,
            "budget_used": 0.0,
            "n2n_bytes": 0.0,
            "pools": [],
            "feasible": False,
        }
    return {
        "x_nd": result.tokens_per_s / nd_tps,
        "tokens_per_s": result.tokens_per_s,
        "output_tokens_per_s": result.output_tokens_per_s,
        "makespan_s": result.makespan_s,
        "sigma_joint": alloc.sigma_joint,
        "budget_used": alloc.cost,
        "n2n_bytes": result.n2n_bytes,
        "pools": [p.to_json(result.pool_busy_s[p.name] / result.makespan_s) for p in alloc.pools],
        "feasible": True,
        "events": result.num_events,
        "kv_handoff_bytes": result.kv_handoff_bytes,
        "af_bytes": result.af_bytes,
    }


def constants(config: PlanConfig, budget: object, devices: tuple[CatalogDevice, ...]) -> dict:
    """Every constant a plan used, by name (docs/planner.md explains each)."""
    fit = power_fit()
    return {
        "alpha": fit.alpha,
        "p_ref_w": fit.p_ref_w,
        "f_ref_tflops": fit.f_ref_tflops,
        "d2d_gbs": D2D_GBS,
        "d2d_domain": D2D_DOMAIN,
        "n2n_gbs": config.n2n_gbs,
        "link_latency_us": config.link_latency_us,
        "af_microbatches": config.af_microbatches,
        "prefill_token_budget": config.prefill_token_budget,
        "max_decode_batch": config.max_decode_batch,
        "top_k": config.top_k,
        "grid": config.grid,
        "shortlist": config.shortlist,
        "sigma": config.sigma,
        "af_prefill": config.af_prefill,
        "budget_scale": config.scale,
        "budget_anchor": config.budget_anchor,
        "budget_ref_io": config.budget_ref_io,
        "nd_schedule": config.nd_schedule,
        "budget_reference_cost": getattr(budget, "reference_cost", None),
        "budget_reference": getattr(budget, "reference", None),
        "tp_degrees": list(TP_DEGREES),
        "pp_degrees": list(PP_DEGREES),
        "ep_policy": "MoE F pools: e = t*p*d (experts over all the pool's devices); else 1",
        "decode_ctx_grid_tokens": DECODE_CTX_GRID,
        "decode_slots": "max_decode_batch x min dp of the pools running da/df",
        "kv_reservation": "whole final context reserved at decode admission",
        "efficiency": config.efficiency,
        "arrivals": config.arrivals,
        "length_cv": config.length_cv,
        "profile_decode_batch": PROFILE_DECODE_BATCH,
        "agentic_maxlen": AGENTIC_MAXLEN,
        "num_catalog_devices": len(devices),
    }

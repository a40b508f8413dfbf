"""The planner's entry point: ``plan_disagg(PlanConfig) -> dict`` (``plan disagg --json``).

For each mode: phase 1 short-lists candidates per pool, phase 2 ranks budget splits, the top K are
run end to end (run.py) and the best simulated tokens/s is kept. ``x_nd`` compares every mode with
ND's best on the identical request list. The result carries every constant used.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from dualpath.core.errors import ConfigError, require
from dualpath.cost.efficiency import get_efficiency
from dualpath.cost.stages import STAGES, stage_roofline_s, stage_work
from dualpath.planner.ablation import apply_overrides
from dualpath.planner.budget import BUDGET_SCALE, resolve_budget
from dualpath.planner.catalog import catalog as load_catalog
from dualpath.planner.links import D2D_DOMAIN, D2D_GBS, N2N_GBS
from dualpath.planner.modes import MODES, mode_spec, parse_modes
from dualpath.planner.parallel import DECODE_CTX_GRID, PP_DEGREES, TP_DEGREES
from dualpath.planner.power import power_fit
from dualpath.planner.run import RunConfig, RunResult, simulate
from dualpath.planner.search import Counts, Demand
from dualpath.planner.search_allocate import phase2
from dualpath.planner.search_shortlist import phase1
from dualpath.planner.sigma_batch import SIGMA_RULES
from dualpath.planner.workloads import AGENTIC_MAXLEN, WORKLOADS, make_requests
from dualpath.spec.device import BITS
from dualpath.spec.models import get_model

if TYPE_CHECKING:
    from dualpath.planner.catalog import CatalogDevice
    from dualpath.planner.pools import Allocation
    from dualpath.spec.device import Device
    from dualpath.spec.models import ModelSpec

PROFILE_DECODE_BATCH = 64  # the decode batch the STAGE profile is read at (a typical busy step)
REFERENCE_DEVICE = {"npu": "npu-2500tf-hbm-190gb", "gpu": "h100"}  # profile's roofline position


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanConfig:
    """One ``plan disagg`` search. Defaults are the issue's (docs/planner.md gives each reason)."""

    model: str
    catalog: Literal["npu", "gpu"]
    io_ratio: float
    modes: tuple[str, ...] = MODES
    budget_w: float | None = None
    budget_usd_hr: float | None = None
    budget_scale: float = BUDGET_SCALE
    top_k: int = 8
    precision: str = "16"
    accuracy_table: Path | None = None
    overrides: Mapping[str, float] = field(default_factory=dict)
    num_requests: int = 500
    rate_rps: float = 125.0
    output_len: int = 1000
    length_cv: float = 0.1
    seed: int = 0
    arrivals: Literal["uniform", "poisson"] = "uniform"
    workload: Literal["io", "agentic", "chatbot"] = "io"
    efficiency: Literal["ideal", "fitted"] = "ideal"
    prices: Path | None = None
    link_latency_us: float = 0.0
    af_microbatches: int = 2
    grid: int = 8
    shortlist: int = 4
    prefill_token_budget: int = 16384
    max_decode_batch: int = 512
    sigma: str = "largest-batch"  # the phase-1 rule; "batch-aware": sigma_batch.py
    n2n_gbs: float = N2N_GBS  # per device and direction across a pool boundary (the paper's 50)

    def __post_init__(self) -> None:
        require(self.catalog in ("npu", "gpu"), "catalog", self.catalog, "choices: npu, gpu")
        require(self.io_ratio > 0, "io_ratio", self.io_ratio, "must be > 0")
        object.__setattr__(self, "modes", parse_modes(self.modes))
        for key in (
            "top_k",
            "num_requests",
            "output_len",
            "af_microbatches",
            "shortlist",
            "prefill_token_budget",
            "max_decode_batch",
        ):
            require(getattr(self, key) >= 1, key, getattr(self, key), "must be >= 1")
        require(self.grid >= 1, "grid", self.grid, "must be >= 1")
        require(self.rate_rps > 0, "rate_rps", self.rate_rps, "must be > 0")
        require(self.link_latency_us >= 0, "link_latency_us", self.link_latency_us, "must be >= 0")
        require(self.workload in WORKLOADS, "workload", self.workload, f"choices: {', '.join(WORKLOADS)}")
        require(
            self.arrivals in ("uniform", "poisson"), "arrivals", self.arrivals, "choices: uniform, poisson"
        )
        get_efficiency(self.efficiency)
        require(self.n2n_gbs > 0, "n2n_gbs", self.n2n_gbs, "must be > 0")
        require(self.sigma in SIGMA_RULES, "sigma", self.sigma, f"choices: {', '.join(SIGMA_RULES)}")
        allowed_precision(self)  # validates precision / accuracy_table


def allowed_precision(config: PlanConfig) -> dict[str, tuple[int, ...]]:
    """Stage -> allowed bits: ``"16"``, ``"16,8,16,4"`` (PA, PF, DA, DF) or ``"search"`` within the
    accuracy table (JSON: workload -> stage -> bits; a ``"default"`` entry is used for workloads
    it does not name; no table: 16 bits only)."""
    text = config.precision.strip()
    if text == "search":
        if config.accuracy_table is None:
            return {s: (16,) for s in STAGES}
        try:
            table = json.loads(Path(config.accuracy_table).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(
                "accuracy_table", str(config.accuracy_table), f"unreadable JSON: {exc}"
            ) from None
        require(
            isinstance(table, dict),
            "accuracy_table",
            str(config.accuracy_table),
            "must map workload -> stage -> allowed bits",
        )
        entry = table.get(config.workload, table.get("default"))
        if not isinstance(entry, dict):
            raise ConfigError(
                "accuracy_table",
                str(config.accuracy_table),
                f"no entry for workload {config.workload!r} (nor 'default'); has {sorted(table)}",
            )
        out: dict[str, tuple[int, ...]] = {}
        for s in STAGES:
            bits = entry.get(s, [16])
            ok = isinstance(bits, list) and bits and all(b in BITS for b in bits)
            require(
                bool(ok),
                f"accuracy_table.{config.workload}.{s}",
                bits,
                f"must be a non-empty list of {', '.join(map(str, BITS))}",
            )
            out[s] = tuple(bits)
        return out
    parts = [p.strip() for p in text.split(",")]
    if len(parts) == 1:
        parts = parts * 4
    require(
        len(parts) == 4,
        "precision",
        config.precision,
        "give one width, four (PA,PF,DA,DF, e.g. 16,8,16,4) or 'search'",
    )
    out = {}
    for s, p in zip(STAGES, parts, strict=True):
        require(
            p.isdigit() and int(p) in BITS,
            "precision",
            config.precision,
            f"each width must be one of {', '.join(map(str, BITS))}",
        )
        out[s] = (int(p),)
    return out


def _mode_json(
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
        out_modes[m] = _mode_json(
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
        "budget_scale": config.budget_scale,
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


def stage_profile_of(
    model: ModelSpec,
    input_len: float,
    output_len: float,
    precision: Mapping[str, int],
    devices: Mapping[str, Device],
    prefill_token_budget: int,
    efficiency: object,
) -> dict[str, dict]:
    """STAGE objects: prefill at the token-budget batch of prompts of I tokens, decode at
    ``PROFILE_DECODE_BATCH`` sequences of context I + O/2; ``bound`` on ``devices[stage]``."""
    length = max(1, round(input_len))
    out: dict[str, dict] = {}
    for s in STAGES:
        if s in ("pa", "pf"):
            batch, ctx = max(1, prefill_token_budget // length), length
        else:
            batch, ctx = PROFILE_DECODE_BATCH, round(input_len + output_len / 2)
        work = stage_work(model, s, batch=batch, context_len=ctx, bits=precision[s])
        dev = devices[s]
        compute_s, memory_s = stage_roofline_s(work, dev, efficiency=efficiency, bits=precision[s])  # type: ignore[arg-type]
        out[s] = {
            "flops": work.flops,
            "weight_bytes": work.weight_bytes,
            "kv_bytes": work.kv_bytes(),
            "kv_share": work.kv_share(),
            "arithmetic_intensity": work.arithmetic_intensity(),
            "bound": "compute" if compute_s >= memory_s else "memory",
            "at": {"batch": batch, "context_len": ctx},
            "device": dev.name,
        }
    return out


def stage_profile(
    model: str,
    io_ratio: float,
    overrides: Mapping[str, float] | None = None,
    precision: str = "16",
    catalog: str = "npu",
    *,
    output_len: int = 1000,
    prefill_token_budget: int = 16384,
) -> dict[str, dict]:
    """``plan disagg profile``: the four STAGE objects of ``model`` at I = O x ``io_ratio``, with
    the roofline position read on the catalogue's reference device (REFERENCE_DEVICE)."""
    cfg = PlanConfig(
        model=model,
        catalog=catalog,
        io_ratio=io_ratio,  # type: ignore[arg-type]
        precision=precision,
        overrides=dict(overrides or {}),
        output_len=output_len,
        prefill_token_budget=prefill_token_budget,
    )
    spec = get_model(model)
    spec = apply_overrides(spec, dict(cfg.overrides)) if cfg.overrides else spec
    allowed = allowed_precision(cfg)
    bits: dict[str, int] = {s: allowed[s][0] for s in STAGES}
    ref = next(d for d in load_catalog(catalog) if d.name == REFERENCE_DEVICE[catalog])
    return stage_profile_of(
        spec,
        max(1.0, output_len * io_ratio),
        float(output_len),
        bits,
        {s: ref.device for s in STAGES},
        prefill_token_budget,
        get_efficiency("ideal"),
    )

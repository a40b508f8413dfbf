"""``PlanConfig``: one ``plan disagg`` search's options, validated, and the precisions they allow."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dualpath.core.errors import ConfigError, require
from dualpath.cost.efficiency import get_efficiency
from dualpath.cost.stages import STAGES
from dualpath.planner.budget import BUDGET_SCALE
from dualpath.planner.budget_demand import BUDGET_ANCHORS, DEMAND_BUDGET_SCALE, DEMAND_REF_IO
from dualpath.planner.links import N2N_GBS
from dualpath.planner.modes import MODES, parse_modes
from dualpath.planner.pools import AF_PREFILL_DEFAULT, AF_PREFILL_RULES
from dualpath.planner.schedule import ND_SCHEDULE_DEFAULT, ND_SCHEDULES
from dualpath.planner.sigma_partner import SIGMA_DEFAULT, SIGMA_RULES
from dualpath.planner.workloads import WORKLOADS
from dualpath.spec.device import BITS


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanConfig:
    """One ``plan disagg`` search. Defaults are the issue's (docs/planner.md gives each reason)."""

    model: str
    catalog: Literal["npu", "gpu"]
    io_ratio: float
    modes: tuple[str, ...] = MODES
    budget_w: float | None = None
    budget_usd_hr: float | None = None
    budget_scale: float | None = None  # None: BUDGET_SCALE (weight anchor) or DEMAND_BUDGET_SCALE
    budget_anchor: str = "weight"  # budget_demand.BUDGET_ANCHORS
    budget_ref_io: float | str = DEMAND_REF_IO  # demand anchor's I/O ratio, or "plan" (the plan's own)
    top_k: int = 64  # allocations simulated per mode (the paper does not give K)
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
    shortlist: int = 16  # (device, precision) groups kept per pool after phase 1
    prefill_token_budget: int = 16384
    max_decode_batch: int = 512
    sigma: str = SIGMA_DEFAULT  # sigma_partner.SIGMA_RULES
    n2n_gbs: float = N2N_GBS  # per device and direction across a pool boundary (the paper's 50)
    af_prefill: str = AF_PREFILL_DEFAULT  # pools.AF_PREFILL_RULES: what a split prefill unit sends
    nd_schedule: str = ND_SCHEDULE_DEFAULT  # schedule.ND_SCHEDULES: pools running both phases

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
        require(
            self.af_prefill in AF_PREFILL_RULES,
            "af_prefill",
            self.af_prefill,
            f"choices: {', '.join(AF_PREFILL_RULES)}",
        )
        require(
            self.nd_schedule in ND_SCHEDULES,
            "nd_schedule",
            self.nd_schedule,
            f"choices: {', '.join(ND_SCHEDULES)}",
        )
        require(
            self.budget_anchor in BUDGET_ANCHORS,
            "budget_anchor",
            self.budget_anchor,
            f"choices: {', '.join(BUDGET_ANCHORS)}",
        )
        if self.budget_ref_io != "plan":
            ref = self.budget_ref_io
            ok = isinstance(ref, (int, float)) and not isinstance(ref, bool) and ref > 0
            require(ok, "budget_ref_io", ref, "a positive I/O ratio or 'plan'")
            object.__setattr__(self, "budget_ref_io", float(ref))  # type: ignore[arg-type]
        if self.budget_scale is not None:
            require(self.budget_scale > 0, "budget_scale", self.budget_scale, "must be > 0")
        allowed_precision(self)  # validates precision / accuracy_table

    @property
    def scale(self) -> float:
        """The budget scale in force: ``budget_scale``, else the anchor's default."""
        if self.budget_scale is not None:
            return float(self.budget_scale)
        return BUDGET_SCALE if self.budget_anchor == "weight" else DEMAND_BUDGET_SCALE

    @property
    def reference_io(self) -> float:
        """The demand anchor's I/O ratio (``plan``: the plan's own)."""
        return self.io_ratio if self.budget_ref_io == "plan" else float(self.budget_ref_io)


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

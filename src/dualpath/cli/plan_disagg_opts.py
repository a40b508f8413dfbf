"""The ``plan disagg`` commands' shared options (typer annotations) and the helpers that turn them
into a PlanConfig and write or print a result (cli/plan_disagg.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from dualpath.cli._common import print_json
from dualpath.core.errors import ConfigError, require

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
OutOpt = Annotated[str | None, typer.Option("--out", help="Folder to write the JSON result into.")]
CatalogOpt = Annotated[
    str, typer.Option("--catalog", help="Design space: npu (power budget) or gpu (USD/hour budget).")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="Model ablation NAME=VALUE (repeatable): kv_width, kv_lora_rank, active_experts_x, "
        "total_experts_x, ffn_expansion, dtype_bytes.",
    ),
]
ScaleOpt = Annotated[
    float | None,
    typer.Option(
        "--budget-scale",
        help="Budget = scale x cost of the cheapest ND deployment holding the "
        "16-bit weights, or of the demand anchor (default: the fitted BUDGET_SCALE; demand: 0.5).",
    ),
]
TopKOpt = Annotated[
    int | None, typer.Option("--top-k", help="Allocations simulated end to end per mode (default 64).")
]
ShortlistOpt = Annotated[
    int | None, typer.Option("--shortlist", help="(device, precision) groups kept per pool (default 16).")
]
PrecOpt = Annotated[
    str | None,
    typer.Option(
        "--precision",
        help="Stage bits: 16, or PA,PF,DA,DF such as 16,8,16,4, or 'search' (with --accuracy-table).",
    ),
]
AccOpt = Annotated[
    Path | None,
    typer.Option("--accuracy-table", help="JSON workload -> stage -> allowed bits, for --precision search."),
]
ReqOpt = Annotated[int | None, typer.Option("--requests", help="Requests per run (default 500).")]
RateOpt = Annotated[float | None, typer.Option("--rate", help="Arrival rate, requests/s (default 125).")]
OutLenOpt = Annotated[
    int | None,
    typer.Option("--output-len", help="Output tokens O per request (default 1000); input = O x I/O."),
]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Seed of the request lengths.")]
WorkOpt = Annotated[
    str | None,
    typer.Option(
        "--workload", help="io (I/O ratio), agentic (synthetic agent turns) or chatbot (Azure trace)."
    ),
]
EffOpt = Annotated[
    str | None,
    typer.Option("--efficiency", help="ideal (the paper's Eq. 1) or fitted (the project's H100 values)."),
]
PricesOpt = Annotated[
    Path | None, typer.Option("--prices", help="JSON GPU name -> USD/hour, overriding the dated price table.")
]
SigmaOpt = Annotated[
    str | None,
    typer.Option(
        "--sigma",
        help="Capacity score: partner-batch (default: each stage rated at the batch its partner gives "
        "it) or largest-batch (every replica at the largest batch it holds, d x sigma1).",
    ),
]
AfPrefillOpt = Annotated[
    str | None,
    typer.Option(
        "--af-prefill",
        help="What a split prefill unit sends over N2N: once-per-prompt (default: one hidden state per "
        "token each way), round-trip-per-layer (every layer, as decode) or free (nothing).",
    ),
]
NdScheduleOpt = Annotated[
    str | None,
    typer.Option(
        "--nd-schedule",
        help="Pools running both phases (ND, AF): prefill-first (default: decode waits) or "
        "token-budget (decode and prefill chunks share each iteration's token budget).",
    ),
]
AnchorOpt = Annotated[
    str | None,
    typer.Option(
        "--budget-anchor",
        help="Default budget = scale x weight (cheapest ND holding the weights, default) or demand "
        "(cheapest ND reaching sigma = 1 at --budget-ref-io).",
    ),
]
RefIoOpt = Annotated[
    str | None,
    typer.Option(
        "--budget-ref-io",
        help="Reference I/O ratio of the demand anchor (default 10), or 'plan' for each plan's own ratio.",
    ),
]

N2nOpt = Annotated[
    float | None,
    typer.Option("--n2n-gbs", help="N2N GB/s per device and direction across a pool boundary (default 50)."),
]


def config_from(**given: Any) -> Any:
    """A PlanConfig from the options that were given; the rest keep PlanConfig's defaults."""
    from dualpath.planner.config import PlanConfig

    kwargs = {k: v for k, v in given.items() if v is not None}
    return PlanConfig(**kwargs)


def parse_sets(items: list[str] | None) -> dict[str, float]:
    """``["kv_width=4096", ...]`` -> ``{"kv_width": 4096.0}``; ConfigError naming a bad item."""
    overrides: dict[str, float] = {}
    for item in items or []:
        name, sep, text = item.partition("=")
        require(bool(sep) and bool(name.strip()), "set", item, "expected NAME=VALUE")
        try:
            overrides[name.strip()] = float(text)
        except ValueError:
            raise ConfigError(f"set {name.strip()}", text, "expected a number") from None
    return overrides


def parse_ref_io(text: str | None) -> float | str | None:
    """``--budget-ref-io``: a positive number or ``plan``; ConfigError naming a bad value."""
    if text is None or text.strip() == "plan":
        return None if text is None else "plan"
    try:
        value = float(text)
    except ValueError:
        raise ConfigError("budget_ref_io", text, "a positive I/O ratio or 'plan'") from None
    require(value > 0, "budget_ref_io", text, "a positive I/O ratio or 'plan'")
    return value


def modes_of(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    from dualpath.planner.report import _split

    return tuple(_split(text))


def budget_options(
    budget_w: float | None, budget_usd_hr: float | None, budget_scale: float | None
) -> dict[str, float | None]:
    given = {
        k: v
        for k, v in (
            ("--budget-w", budget_w),
            ("--budget-usd-hr", budget_usd_hr),
            ("--budget-scale", budget_scale),
        )
        if v is not None
    }
    require(
        len(given) <= 1,
        "budget",
        ", ".join(given),
        "give at most one of --budget-w, --budget-usd-hr and --budget-scale",
    )
    return {"budget_w": budget_w, "budget_usd_hr": budget_usd_hr, "budget_scale": budget_scale}


def write_json(out: str | None, name: str, obj: dict) -> None:
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, name), "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=2, default=str)


def emit(
    result: dict, json_out: bool, show: Callable[[dict], None], out: str | None = None, name: str = ""
) -> None:
    """Write ``result`` to ``out/name`` (with ``--out``), then print it as JSON or as tables."""
    if name:
        write_json(out, name, result)
    if json_out:
        print_json(result)
    else:
        show(result)

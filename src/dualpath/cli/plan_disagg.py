"""``dualpath plan disagg``: the disaggregation planner (ND / PD / AF / PDAF; docs/planner.md).

``plan disagg`` plans one model; ``sweep``, ``ablate``, ``profile``, ``catalog`` and ``figures`` are
sub-commands. Every option left out takes its default from :class:`dualpath.planner.config.PlanConfig`
(options default to None here and are dropped before the config is built). The planner modules are
imported inside command bodies so ``dualpath plan`` starts fast.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from dualpath.cli._common import print_json
from dualpath.cli.plan_disagg_opts import (
    AccOpt,
    AfPrefillOpt,
    AnchorOpt,
    CatalogOpt,
    EffOpt,
    JsonOpt,
    N2nOpt,
    NdScheduleOpt,
    OutLenOpt,
    OutOpt,
    PrecOpt,
    PricesOpt,
    RateOpt,
    RefIoOpt,
    ReqOpt,
    ScaleOpt,
    SeedOpt,
    SetOpt,
    ShortlistOpt,
    SigmaOpt,
    TopKOpt,
    WorkOpt,
    budget_options,
    config_from,
    emit,
    modes_of,
    parse_ref_io,
    parse_sets,
)
from dualpath.cli.plan_disagg_show import (
    progress_lines,
    show_ablate,
    show_catalog,
    show_plan,
    show_profile,
    show_sweep,
)
from dualpath.core.errors import require

disagg_app = typer.Typer(
    help="Disaggregation planner: when do PD, AF and PDAF beat ND?",
    invoke_without_command=True,
    no_args_is_help=False,
)


@disagg_app.callback()
def disagg(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option("--model", help="Model name (see `dualpath models`).")] = None,
    catalog: CatalogOpt = "npu",
    io: Annotated[float | None, typer.Option("--io", help="Input/output length ratio I/O.")] = None,
    mode: Annotated[str | None, typer.Option("--mode", help="Comma list of nd, pd, af, pdaf.")] = None,
    budget_w: Annotated[float | None, typer.Option("--budget-w", help="Power budget, W (npu).")] = None,
    budget_usd_hr: Annotated[
        float | None, typer.Option("--budget-usd-hr", help="Price budget, USD/hour (gpu).")
    ] = None,
    budget_scale: ScaleOpt = None,
    top_k: TopKOpt = None,
    precision: PrecOpt = None,
    accuracy_table: AccOpt = None,
    sets: SetOpt = None,
    requests: ReqOpt = None,
    rate: RateOpt = None,
    output_len: OutLenOpt = None,
    length_cv: Annotated[
        float | None, typer.Option("--length-cv", help="CV of the normal request lengths (default 0.1).")
    ] = None,
    seed: SeedOpt = None,
    arrivals: Annotated[
        str | None, typer.Option("--arrivals", help="uniform (fixed spacing) or poisson.")
    ] = None,
    workload: WorkOpt = None,
    efficiency: EffOpt = None,
    prices: PricesOpt = None,
    link_latency_us: Annotated[
        float | None, typer.Option("--link-latency-us", help="Per-transfer latency, us.")
    ] = None,
    af_microbatches: Annotated[
        int | None, typer.Option("--af-microbatches", help="AF ping-pong micro-batches m (default 2).")
    ] = None,
    sigma: SigmaOpt = None,
    n2n_gbs: N2nOpt = None,
    af_prefill: AfPrefillOpt = None,
    nd_schedule: NdScheduleOpt = None,
    budget_anchor: AnchorOpt = None,
    budget_ref_io: RefIoOpt = None,
    shortlist: ShortlistOpt = None,
    grid: Annotated[
        int | None, typer.Option("--grid", help="Phase 2 splits the budget on a 1/GRID grid (default 8).")
    ] = None,
    prefill_token_budget: Annotated[
        int | None,
        typer.Option("--prefill-token-budget", help="Tokens per prefill iteration and lane (default 16384)."),
    ] = None,
    max_decode_batch: Annotated[
        int | None,
        typer.Option("--max-decode-batch", help="Continuous-batching cap per decode replica (default 512)."),
    ] = None,
    json_out: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Plan one model: search each mode's pools under the budget, simulate the top K, compare."""
    if ctx.invoked_subcommand is not None:
        return
    _require_plan_inputs(model, io)
    config = config_from(
        model=model,
        catalog=catalog,
        io_ratio=io,
        modes=modes_of(mode),
        **budget_options(budget_w, budget_usd_hr, budget_scale),
        top_k=top_k,
        precision=precision,
        accuracy_table=accuracy_table,
        overrides=parse_sets(sets) or None,
        num_requests=requests,
        rate_rps=rate,
        output_len=output_len,
        length_cv=length_cv,
        seed=seed,
        arrivals=arrivals,
        workload=workload,
        efficiency=efficiency,
        prices=prices,
        link_latency_us=link_latency_us,
        af_microbatches=af_microbatches,
        sigma=sigma,
        n2n_gbs=n2n_gbs,
        af_prefill=af_prefill,
        nd_schedule=nd_schedule,
        budget_anchor=budget_anchor,
        budget_ref_io=parse_ref_io(budget_ref_io),
        shortlist=shortlist,
        grid=grid,
        prefill_token_budget=prefill_token_budget,
        max_decode_batch=max_decode_batch,
    )
    _run_plan(config, json_out, out)


def _require_plan_inputs(model: str | None, io: float | None) -> None:
    """A plan (no sub-command) needs --model and --io: an error naming the missing one."""
    require(
        model is not None,
        "model",
        model,
        "--model is required (or use a sub-command: sweep, ablate, profile, catalog, figures)",
    )
    require(io is not None, "io", io, "--io (the input/output length ratio) is required")


def _run_plan(config: Any, json_out: bool, out: Any) -> None:
    """Plan with progress lines, then print (or --json / --out) the result."""
    from dualpath.planner.api import plan_disagg

    with progress_lines(f"planning {config.model}", total=None) as step:
        result = plan_disagg(config, progress=step)
    emit(result, json_out, show_plan, out, "plan.json")


@disagg_app.command("sweep")
def sweep_cmd(
    catalog: CatalogOpt = "npu",
    models: Annotated[
        str, typer.Option("--models", help="'all' (the paper's eight) or a comma list.")
    ] = "all",
    io: Annotated[
        str, typer.Option("--io", help="Comma list of I/O ratios.")
    ] = "0.01,0.1,1,10,50,100,200,500,1000",
    mode: Annotated[str | None, typer.Option("--mode", help="Comma list of nd, pd, af, pdaf.")] = None,
    budget_scale: ScaleOpt = None,
    top_k: TopKOpt = None,
    precision: PrecOpt = None,
    requests: ReqOpt = None,
    rate: RateOpt = None,
    output_len: OutLenOpt = None,
    seed: SeedOpt = None,
    efficiency: EffOpt = None,
    prices: PricesOpt = None,
    sigma: SigmaOpt = None,
    n2n_gbs: N2nOpt = None,
    af_prefill: AfPrefillOpt = None,
    nd_schedule: NdScheduleOpt = None,
    budget_anchor: AnchorOpt = None,
    budget_ref_io: RefIoOpt = None,
    shortlist: ShortlistOpt = None,
    json_out: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Every model x I/O ratio: x ND per mode, model means and medians, counts, allocations."""
    from dualpath.planner.report import parse_floats, parse_models, sweep

    names, ratios = parse_models(models), parse_floats("io", io)
    base = config_from(
        model=names[0],
        catalog=catalog,
        io_ratio=ratios[0],
        modes=modes_of(mode),
        budget_scale=budget_scale,
        top_k=top_k,
        precision=precision,
        num_requests=requests,
        rate_rps=rate,
        output_len=output_len,
        seed=seed,
        efficiency=efficiency,
        prices=prices,
        sigma=sigma,
        n2n_gbs=n2n_gbs,
        af_prefill=af_prefill,
        nd_schedule=nd_schedule,
        budget_anchor=budget_anchor,
        budget_ref_io=parse_ref_io(budget_ref_io),
        shortlist=shortlist,
    )
    with progress_lines(f"sweep {base.catalog}", total=len(names) * len(ratios)) as step:
        result = sweep(base, names, ratios, progress=step)
    emit(result, json_out, show_sweep, out, f"sweep_{base.catalog}.json")


@disagg_app.command("ablate")
def ablate_cmd(
    factor: Annotated[
        str,
        typer.Option(
            "--factor", help="kv_width, active_experts_x, total_experts_x, ffn_expansion or dtype_bytes."
        ),
    ],
    values: Annotated[
        str | None, typer.Option("--values", help="Comma list (default: the paper's points for the factor).")
    ] = None,
    models: Annotated[
        str, typer.Option("--models", help="Comma list or 'all'.")
    ] = "gpt-oss-120b,glm-4.6,deepseek-v4-flash",
    io: Annotated[float, typer.Option("--io", help="I/O ratio.")] = 100.0,
    catalog: CatalogOpt = "npu",
    budget_scale: ScaleOpt = None,
    top_k: TopKOpt = None,
    requests: ReqOpt = None,
    seed: SeedOpt = None,
    sigma: SigmaOpt = None,
    af_prefill: AfPrefillOpt = None,
    nd_schedule: NdScheduleOpt = None,
    budget_anchor: AnchorOpt = None,
    budget_ref_io: RefIoOpt = None,
    shortlist: ShortlistOpt = None,
    json_out: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """One model factor swept at a fixed budget: PD/AF/PDAF x ND, DA intensity and KV share."""
    from dualpath.planner.report import ABLATION_VALUES, ablate, parse_floats, parse_models

    require(
        factor in ABLATION_VALUES,
        "factor",
        factor,
        f"unknown ablation factor; choices: {', '.join(ABLATION_VALUES)}",
    )
    points = parse_floats("values", values) if values is not None else ABLATION_VALUES[factor]
    names = parse_models(models)
    base = config_from(
        model=names[0],
        catalog=catalog,
        io_ratio=io,
        budget_scale=budget_scale,
        top_k=top_k,
        num_requests=requests,
        seed=seed,
        sigma=sigma,
        af_prefill=af_prefill,
        nd_schedule=nd_schedule,
        budget_anchor=budget_anchor,
        budget_ref_io=parse_ref_io(budget_ref_io),
        shortlist=shortlist,
    )
    with progress_lines(f"ablate {factor}", total=len(names) * len(points)) as step:
        result = ablate(base, factor, points, names, io_ratio=io, progress=step)
    emit(result, json_out, show_ablate, out, f"ablate_{factor}.json")


@disagg_app.command("profile")
def profile_cmd(
    model: Annotated[str, typer.Option("--model", help="Model name.")],
    io: Annotated[float, typer.Option("--io", help="I/O ratio.")] = 100.0,
    sets: SetOpt = None,
    precision: Annotated[str, typer.Option("--precision", help="16 or PA,PF,DA,DF bits.")] = "16",
    catalog: Annotated[str, typer.Option("--catalog", help="npu or gpu (roofline position).")] = "npu",
    json_out: JsonOpt = False,
) -> None:
    """Stage FLOPs and bytes, KV share, arithmetic intensity and roofline position."""
    from dualpath.planner.stage_profile import stage_profile

    stages = stage_profile(model, io, overrides=parse_sets(sets), precision=precision, catalog=catalog)
    result = {
        "model": model,
        "io_ratio": io,
        "catalog": catalog,
        "precision": precision,
        "overrides": parse_sets(sets),
        "stages": stages,
    }
    emit(result, json_out, show_profile)


@disagg_app.command("catalog")
def catalog_cmd(
    catalog: Annotated[str, typer.Option("--catalog", help="npu or gpu.")] = "npu",
    prices: PricesOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Candidate devices with power and price, and the power-law fit."""
    from dualpath.planner.catalog import catalog_report

    result = catalog_report(catalog, prices)
    emit(result, json_out, show_catalog)


@disagg_app.command("figures")
def figures_cmd(
    out: Annotated[
        str, typer.Option("--out", help="Output folder (PNG, CSV, JSON, index.json).")
    ] = "plan_figures",
    quick: Annotated[
        bool, typer.Option("--quick", help="Small grid (3 models, 4 ratios, 100 requests) for tests.")
    ] = False,
    sigma: SigmaOpt = None,
    af_prefill: AfPrefillOpt = None,
    nd_schedule: NdScheduleOpt = None,
    budget_anchor: AnchorOpt = None,
    no_flags: Annotated[
        bool, typer.Option("--no-flags", help="Skip the findings under each rule flag (findings_flags.md).")
    ] = False,
    jobs: Annotated[
        int, typer.Option("--jobs", help="Plan in this many processes (the same results; default 1).")
    ] = 1,
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume", help="Folder of finished plans: read before planning, written as each ends."
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Every planner table and plot of docs/planner.md (Figs. 5-7, Table 5, ablations, rooflines,
    power fit, workloads, the findings under the defaults and under each rule flag)."""
    import dataclasses

    from dualpath.planner.figures import FULL_GRID, QUICK_GRID, make_figures

    grid = QUICK_GRID if quick else FULL_GRID
    given = {
        "sigma": sigma,
        "af_prefill": af_prefill,
        "nd_schedule": nd_schedule,
        "budget_anchor": budget_anchor,
    }
    rules = {k: v for k, v in given.items() if v is not None}
    if rules:
        config_from(model="glm-4.6", catalog="npu", io_ratio=1.0, **rules)  # validates the values
        grid = dataclasses.replace(grid, rules=rules)
    if no_flags:
        grid = dataclasses.replace(grid, variants=())
    with progress_lines("figures", total=None) as step:
        require(jobs >= 1, "jobs", jobs, "must be >= 1")
        index = make_figures(out, quick=quick, grid=grid, progress=step, jobs=jobs, resume=resume)
    if json_out:
        print_json(index)
    else:
        typer.echo(
            f"wrote {len(index['files'])} files to {out}"
            + (f" (skipped: {', '.join(index['skipped'])})" if index["skipped"] else "")
        )

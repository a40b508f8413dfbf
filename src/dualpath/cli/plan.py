"""``dualpath plan ...``: closed-form analysis (P/D range, cache-compute ratio, working set, trend).

The disaggregation planner, ``dualpath plan disagg``, lives in cli/plan_disagg.py; ``dualpath plan
latency`` (TTFT / TPOT of a deployment) in cli/plan_latency.py.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from dualpath.cli._common import print_json, print_table

plan_app = typer.Typer(
    help="Closed-form analysis: P/D range, cache-compute ratio, working set, trend.", no_args_is_help=True
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


@plan_app.command("pd-range")
def pd_range_cmd(
    g: Annotated[int, typer.Option("--g", help="GPUs per node.")] = 8,
    s: Annotated[int, typer.Option("--s", help="Storage NICs per node.")] = 1,
    snic_gbps: Annotated[float, typer.Option(help="Gbps of each storage NIC.")] = 400.0,
    cnic_gbps: Annotated[float, typer.Option(help="Gbps of each GPU's compute NIC (B).")] = 400.0,
    dram_gbs: Annotated[float, typer.Option(help="DRAM bandwidth per node M, GB/s.")] = 500.0,
    node: Annotated[
        str | None, typer.Option(help="Take g, s, NICs and M from a node (see `dualpath hardware`).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Bottleneck-free P/D interval (equations 1-9) and the constraint that binds."""
    from fractions import Fraction

    from dualpath.analysis.pd_range import pd_range

    if node is not None:
        g, s, snic_gbps, cnic_gbps, dram_gbs = _node_numbers(node)
    b = Fraction(str(cnic_gbps)) / 8
    storage = s * Fraction(str(snic_gbps)) / 8
    r = pd_range(g, s, b, dram_gbs, storage_per_node=storage)
    if json_out:
        print_json(_pd_range_json(r))
        return
    _print_pd_range(r, g, s)


def _node_numbers(node: str) -> tuple[int, int, float, float, float]:
    """g, s, storage-NIC Gbps, compute-NIC Gbps and DRAM GB/s of a named node."""
    from dualpath.spec.hardware import get_node

    n = get_node(node)
    return n.num_gpus, n.num_snics, n.snic_gbps, n.cnic_gbps, n.dram_bandwidth_gbs


def _pd_range_json(r: Any) -> dict[str, Any]:
    lo = None if r.min_p_over_d is None else float(r.min_p_over_d)
    return {
        "min_p_over_d": lo,
        "max_p_over_d": float(r.max_p_over_d),
        "binding": r.binding,
        "min_p_over_d_exact": str(r.min_p_over_d),
        "max_p_over_d_exact": str(r.max_p_over_d),
        "binding_lower": r.binding_lower,
        "feasible": r.feasible,
        "pe_cnic_read_ok": r.pe_cnic_read_ok,
        "upper_bounds": {k: float(v) for k, v in r.upper_bounds.items()},
    }


def _print_pd_range(r: Any, g: int, s: int) -> None:
    lo = None if r.min_p_over_d is None else float(r.min_p_over_d)
    rows: list[list[object]] = [
        ["min P/D", str(r.min_p_over_d), lo, r.binding_lower],
        ["max P/D", str(r.max_p_over_d), float(r.max_p_over_d), r.binding],
    ]
    rows += [[f"  bound {k}", str(v), float(v), ""] for k, v in r.upper_bounds.items()]
    print_table(
        f"P/D range: {g} GPUs and {s} storage NICs per node (feasible={r.feasible})",
        ["quantity", "exact (fraction)", "P/D (prefill/decode nodes)", "binding constraint"],
        rows,
        legend=[
            "P/D: prefill nodes per decode node with no bottleneck (equations "
            "1-9); 'bound X': the upper limit constraint X alone sets."
        ],
    )


@plan_app.command("cache-ratio")
def cache_ratio_cmd(
    model: Annotated[str, typer.Option(help="Model name (see `dualpath models`).")] = "deepseek-v3.2",
    append: Annotated[str, typer.Option(help="Appended (new) tokens per turn.")] = "429",
    context: Annotated[
        list[str] | None,
        typer.Option(
            help="Context length(s): repeat the option or separate by commas, e.g. --context 16k,64k."
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """GB of cached KV to load per PFLOP of prefill compute."""
    from dualpath.analysis.cache_ratio import cache_compute_ratios
    from dualpath.core.units import parse_tokens
    from dualpath.spec.models import get_model

    spec = get_model(model)
    contexts = [parse_tokens(c) for arg in (context or ["16k,32k,64k"]) for c in arg.split(",") if c]
    ratios = cache_compute_ratios(spec, parse_tokens(append), contexts)
    rows = [
        {
            "context": r.context_len,
            "gb_per_pflop": r.gb_per_pflop,
            "kv_gb": r.kv_gb,
            "prefill_pflop": r.prefill_pflop,
        }
        for r in ratios
    ]
    if json_out:
        print_json({"model": model, "append": parse_tokens(append), "ratios": rows})
        return
    print_table(
        f"Cache-compute ratio: {model}, append {parse_tokens(append)} tokens",
        ["context (tokens)", "cache-compute (GB/PFLOP)", "cached KV (GB)", "prefill (PFLOP)"],
        [[r["context"], r["gb_per_pflop"], r["kv_gb"], r["prefill_pflop"]] for r in rows],
    )


@plan_app.command("working-set")
def working_set_cmd(
    model: Annotated[str, typer.Option(help="Model name.")] = "deepseek-v3.2",
    aps: Annotated[float, typer.Option(help="Agent arrival rate, agents/s.")] = 0.1,
    mean_jct_s: Annotated[float, typer.Option(help="Mean job completion time, s.")] = 570.0,
    mean_total_len: Annotated[float, typer.Option(help="Mean final trajectory length, tokens.")] = 55958,
    basis: Annotated[str, typer.Option(help="cache (KV + DSA indexer keys) or kv.")] = "cache",
    json_out: JsonOpt = False,
) -> None:
    """Little's-law working set of cached KV."""
    from dualpath.analysis.working_set import working_set
    from dualpath.spec.models import get_model

    ws = working_set(get_model(model), aps, mean_jct_s, mean_total_len, basis)  # type: ignore[arg-type]
    out = {
        "model": model,
        "aps": aps,
        "mean_jct_s": mean_jct_s,
        "mean_total_len": mean_total_len,
        "basis": basis,
        "agents_in_flight": ws.agents_in_flight,
        "bytes_per_token": ws.bytes_per_token,
        "working_set_gb": ws.working_set_gb,
    }
    if json_out:
        print_json(out)
        return
    units = {
        "aps": "agents/s",
        "mean_jct_s": "s",
        "mean_total_len": "tokens",
        "agents_in_flight": "agents",
        "bytes_per_token": "bytes",
        "working_set_gb": "GB",
    }
    print_table(
        f"Working set: {model}",
        ["quantity", "value", "unit"],
        [[k, v, units.get(k, "")] for k, v in out.items()],
    )


@plan_app.command("trend")
def trend_cmd(json_out: JsonOpt = False) -> None:
    """I/O-to-compute ratio across GPU generations (A100 -> H100 -> B200)."""
    from dataclasses import asdict

    from dualpath.analysis.trend import io_compute_trend

    t = io_compute_trend()
    summary = {
        "compute_x": t.compute_x,
        "nic_x": t.nic_x,
        "hbm_capacity_x": t.hbm_capacity_x,
        "hbm_bandwidth_x": t.hbm_bandwidth_x,
        "io_to_compute_drop_x": t.io_to_compute_drop_x,
    }
    if json_out:
        print_json(
            {
                "points": [asdict(p) for p in t.points],
                **summary,
                "dtype_basis": "narrowest dense float dtype per generation",
            }
        )
        return
    print_table(
        "I/O-to-compute trend",
        [
            "GPU",
            "year",
            "dtype",
            "dense (TFLOPS)",
            "NIC (Gbit/s)",
            "HBM (GB)",
            "I/O per compute (bytes/kFLOP)",
        ],
        [
            [p.gpu, p.year, p.dtype, p.dense_tflops, p.nic_gbps, p.hbm_gb, p.io_bytes_per_kflop]
            for p in t.points
        ],
    )
    print_table(
        f"{t.points[0].gpu} -> {t.points[-1].gpu}",
        ["quantity", "factor (x)"],
        [[k, v] for k, v in summary.items()],
    )


def register(app: typer.Typer) -> None:
    """Add the ``plan`` sub-app (with ``plan disagg``, cli/plan_disagg.py) to the top-level app."""
    from dualpath.cli.plan_disagg import disagg_app
    from dualpath.cli.plan_latency import register as register_latency

    plan_app.add_typer(disagg_app, name="disagg")
    register_latency(plan_app)
    app.add_typer(plan_app, name="plan")

"""``dualpath simulate``: the cluster simulator (offline JCT, online capacity, paper figures).

The flags are ``cli.sim_options``' dataclasses; ``run_cli`` runs one ``SimulateOptions`` on a paper
cluster in named steps: check the choices, build the cluster, run every system (offline or the
online sweep), write and print the result."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import TYPE_CHECKING, Any

import typer

from dualpath.cli.option_fields import command_from
from dualpath.cli.sim_options import (
    DEFAULT_CLUSTER,
    DEFAULT_SNIC_DIRECTIONS,
    FidelityOptions,
    FiguresOptions,
    ProfileOptions,
    SimulateOptions,
)
from dualpath.sim.config import SimConfig

if TYPE_CHECKING:
    from rich.console import Console

    from dualpath.sim.calibration import Calibration
    from dualpath.spec.clusters import ClusterPreset

SIM_HELP = "Simulate a PD-disaggregated cluster serving agent trajectories (Basic, DualPath, Oracle...)."


def register(app: typer.Typer) -> None:
    """Add ``simulate`` (and ``simulate figures``) to the top-level app."""
    sim = typer.Typer(help=SIM_HELP, invoke_without_command=True, no_args_is_help=False)
    sim.callback()(command_from(SimulateOptions, simulate, context=True, doc=""))
    sim.command("profile")(command_from(ProfileOptions, profile))
    sim.command("figures")(command_from(FiguresOptions, figures))
    sim.command("fidelity")(command_from(FidelityOptions, fidelity))
    app.add_typer(sim, name="simulate")


def simulate(ctx: typer.Context, opts: SimulateOptions) -> None:
    if ctx.invoked_subcommand is not None:
        return
    from dualpath.sim.calibration import DEFAULT_CALIBRATION

    if opts.cluster is not None or opts.device is not None:
        from dualpath.cli.sim_local import run_local_cli

        run_local_cli(opts)
        return
    run_cli(opts, DEFAULT_CALIBRATION.with_overrides(opts.calibrate or []))


def profile(opts: ProfileOptions) -> None:
    """Measure the real engine's step times (serve extra) for --device profile:FILE."""
    from dualpath.cli.sim_local import run_profile_cli

    run_profile_cli(**dataclasses.asdict(opts))


def figures(opts: FiguresOptions) -> None:
    """Regenerate the paper's figures (offline grid, P/D, scaling, online, ablation, ...)."""
    from dualpath.cli._common import print_json
    from dualpath.sim.harness.figures import make_figures

    index = make_figures(opts.out, quick=opts.quick)
    if opts.json_out:
        print_json(index)
    else:
        typer.echo(f"wrote {len(index['files'])} files to {opts.out}")


def fidelity(opts: FidelityOptions) -> None:
    """Run every published point (spec section 10): simulated vs published, relative errors."""
    from dualpath.cli.sim_fidelity import run_fidelity_cli

    run_fidelity_cli(**dataclasses.asdict(opts))


@dataclasses.dataclass(frozen=True)
class _Run:
    """What every system's run shares: the options, the checked choices, the cluster."""

    opts: SimulateOptions
    calibration: Calibration
    cluster: ClusterPreset
    ties: dict[str, str]  # the tie-break choices asked for (they go into the result)

    def sim_config(self, name: str, out_dir: str | None) -> dict[str, Any]:
        """``SimConfig``'s fields for system ``name`` (the ties' defaults filled in)."""
        from dualpath.sim.config import get_system

        o = self.opts
        return {
            "system": get_system(name),
            "cluster": self.cluster,
            "seed": o.seed,
            "cost_model": o.cost_model,
            "out_dir": out_dir,
            "calibration": self.calibration,
            "snic_directions": o.snic_directions,
            "pe_scope": o.pe_scope,
            "read_tie": o.read_tie or _sim_default("read_tie"),
            "pe_tie": o.pe_tie or _sim_default("pe_tie"),
            "pe_fetch": o.pe_fetch or _sim_default("pe_fetch"),
        }


def _sim_default(name: str) -> Any:
    from dualpath.cli._common import default_of

    return default_of(SimConfig, name)


def run_cli(opts: SimulateOptions, calibration: Calibration) -> None:
    """Run ``opts`` on its paper cluster: one offline run per system, or each system's online
    capacity sweep; print the tables (or one JSON object) and write ``result.json`` under --out."""
    from rich.console import Console

    run = _prepare(opts, calibration)
    started = time.perf_counter()
    err = Console(stderr=True)
    build = _check_build(opts, err)
    result = _header(run, build)
    if opts.online:
        _run_online(run, result, err)
    else:
        _run_offline(run, result, err)
    result["wall_s"] = time.perf_counter() - started
    result["events"] = sum(
        r.get("events", 0) or sum(p["events"] for p in r.get("points", []))
        for r in result["systems"].values()
    )
    _emit(run, result)


def _prepare(opts: SimulateOptions, calibration: Calibration) -> _Run:
    """Check every choice (a bad one: a clear error before any run) and build the cluster."""
    from dualpath.cli._common import check_choice, check_scheduler_choices
    from dualpath.core.links import SNIC_DIRECTIONS
    from dualpath.sim.config import SIM_COST_MODELS, get_system
    from dualpath.sim.harness.experiments import make_cluster
    from dualpath.spec.hardware import NODES

    for name in opts.systems:
        get_system(name)  # fail early with the choices
    check_choice("cost model", opts.cost_model, SIM_COST_MODELS)
    check_choice("snic_directions", opts.snic_directions, SNIC_DIRECTIONS)
    ties = check_scheduler_choices(opts.pe_scope, opts.read_tie, opts.pe_tie, opts.pe_fetch)
    check_choice("node", opts.node, NODES)
    paper = make_cluster(opts.model, opts.pd_or_default, node=opts.node, dram_buffer_gb=opts.dram_buffer_gb)
    cluster = dataclasses.replace(paper, snic_gbps=opts.snic_gbps)
    return _Run(opts, calibration, cluster, ties)


def _check_build(opts: SimulateOptions, err: Console) -> dict[str, Any]:
    """The compiled build's status; a note when a large run goes pure, a warning when stale."""
    from dualpath.sim import compiled

    build = compiled.status()
    if build["pure"] and not opts.online and opts.num_agents * len(opts.systems) >= 4096:
        err.print(f"[dim]note: {compiled.PURE_NOTICE}")
    if build["stale"]:
        err.print(
            f"[yellow]warning: compiled modules older than their source (rebuild with "
            f"DUALPATH_COMPILE=1, or delete the .so files): {', '.join(build['stale'])}"
        )
    return build


def _header(run: _Run, build: dict[str, Any]) -> dict[str, Any]:
    """The result's settings; the non-default ones only when asked for (so the default runs'
    JSON stays as it was)."""
    opts = run.opts
    result: dict[str, Any] = {
        "model": opts.model,
        "pd": run.cluster.pd_label,
        "maxlen": opts.maxlen,
        "systems": {},
        "calibration": run.calibration.as_constants(),
        "calibration_overrides": run.calibration.overrides(),
        "compiled": not build["pure"],
    }
    if opts.node != DEFAULT_CLUSTER.node:
        result["node"] = opts.node
    if opts.snic_gbps is not None:
        result["snic_gbps"] = opts.snic_gbps
    if opts.snic_directions != DEFAULT_SNIC_DIRECTIONS:
        result["snic_directions"] = opts.snic_directions
    if opts.pe_scope is not None:
        result["pe_scope"] = opts.pe_scope
    result.update(run.ties)
    return result


def _run_online(run: _Run, result: dict[str, Any], err: Console) -> None:
    """Each system's capacity sweep over --aps (one workload of 500 agents, Poisson arrivals)."""
    from dualpath.cli.progress import Progress
    from dualpath.core.units import parse_tokens
    from dualpath.sim.harness.experiments import WorkloadSpec, make_trajectories
    from dualpath.sim.harness.online import capacity_sweep, parse_aps

    opts = run.opts
    rates = parse_aps(opts.aps)
    base = make_trajectories(
        WorkloadSpec(maxlen=parse_tokens(opts.maxlen), num_agents=500, seed=opts.seed, trace=opts.trace)
    )
    result["mode"] = "online"
    ordered = sorted(rates)  # capacity_sweep runs the rates in increasing order
    systems = opts.systems
    with Progress("online sweep", total=len(rates) * len(systems), console=err) as bar:
        for k, name in enumerate(systems):
            done = [0]

            def step(name: str = name, done: list[int] = done) -> None:
                done[0] += 1
                nxt = f"aps={ordered[done[0]]:g}" if done[0] < len(ordered) else "done"
                bar.advance(description=f"online {name} {nxt}")

            bar.update(f"online {name} aps={ordered[0]:g}")
            cfg = run.sim_config(name, None)
            del cfg["system"], cfg["out_dir"]
            result["systems"][name] = capacity_sweep(
                name, base_trajs=base, rates=rates, horizon_s=opts.horizon, progress=step, **cfg
            )
            bar.update(completed=(k + 1) * len(rates))  # a sweep stops at the first miss


def _run_offline(run: _Run, result: dict[str, Any], err: Console) -> None:
    """One run of --agents trajectories per system."""
    from dualpath.cli.progress import Progress
    from dualpath.core.units import parse_tokens
    from dualpath.sim.harness.experiments import WorkloadSpec, make_trajectories
    from dualpath.sim.harness.runner import run_one

    opts = run.opts
    work = WorkloadSpec(
        maxlen=parse_tokens(opts.maxlen),
        num_agents=opts.num_agents,
        seed=opts.seed,
        trace=opts.trace,
        append_scale=opts.append_scale,
        gen_scale=opts.gen_scale,
    )
    trajs = make_trajectories(work)
    result["mode"] = "offline"
    result["agents"] = len(trajs)
    with Progress("simulating", total=len(opts.systems), console=err) as bar:
        for name in opts.systems:
            bar.update(f"simulating {name} ({len(trajs)} agents)")
            res = run_one(SimConfig(**run.sim_config(name, opts.out)), trajs)
            jct = res.get("jct_s") or 0.0
            res["requests_per_sim_s"] = res["num_requests"] / jct if jct > 0 else None
            result["systems"][name] = res
            bar.advance()


def _emit(run: _Run, result: dict[str, Any]) -> None:
    """``result.json`` under --out; one JSON object (--json) or the tables."""
    from dualpath.cli._common import print_json
    from dualpath.cli.sim_tables import print_offline, print_online

    opts = run.opts
    if opts.out:
        os.makedirs(opts.out, exist_ok=True)
        with open(os.path.join(opts.out, "result.json"), "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2, default=str)
    if opts.json_out:
        print_json(result)
    elif opts.online:
        print_online(result, opts.model, run.cluster.pd_label)
    else:
        print_offline(result, opts.model, run.cluster.pd_label, opts.maxlen)

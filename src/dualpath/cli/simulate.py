"""``dualpath simulate``: the cluster simulator (offline JCT, online capacity, paper figures)."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

import typer

from dualpath.cli._common import choices_help, default_of
from dualpath.core.links import SNIC_DIRECTIONS
from dualpath.policy.config import PE_SCOPES, PE_TIES, READ_TIES
from dualpath.sim.config import PE_FETCHES, SIM_COST_MODELS, SYSTEMS, SimConfig
from dualpath.sim.harness.experiments import WorkloadSpec
from dualpath.sim.harness.online import DEFAULT_APS, HORIZON_S
from dualpath.spec.clusters import DEFAULT_SIM_CLUSTER, get_cluster
from dualpath.spec.hardware import NODES

if TYPE_CHECKING:
    from dualpath.sim.calibration import Calibration

_DEFAULT = get_cluster(DEFAULT_SIM_CLUSTER)
_WORKLOAD = WorkloadSpec()  # the offline workload's defaults
_DEFAULT_SYSTEMS = "basic,dualpath,oracle"
_DEFAULT_PD = f"{_DEFAULT.num_prefill_nodes}p{_DEFAULT.num_decode_nodes}d"
SIM_HELP = "Simulate a PD-disaggregated cluster serving agent trajectories (Basic, DualPath, Oracle...)."


def register(app: typer.Typer) -> None:
    """Add ``simulate`` (and ``simulate figures``) to the top-level app."""
    sim = typer.Typer(help=SIM_HELP, invoke_without_command=True, no_args_is_help=False)

    @sim.callback()
    def simulate(
        ctx: typer.Context,
        model: str = typer.Option(_DEFAULT.model, help="Model name (see `dualpath models`)."),
        pd: str = typer.Option(
            None,
            help=f"Prefill/decode nodes, e.g. 2p4d, 48p96d (default {_DEFAULT_PD}; the local "
            "cluster: engines, default 1p2d).",
        ),
        cluster: str = typer.Option(
            None,
            help="local: our own `dualpath serve` cluster on this machine (sim/local.py; needs "
            "--device profile:FILE). Default: the paper's cluster of --model / --pd / --node.",
        ),
        device: str = typer.Option(
            None,
            help="profile:FILE: the engines' step times from a measured engine profile "
            "(`dualpath simulate profile --out FILE`); needs --cluster local.",
        ),
        cnic_gbps: float = typer.Option(
            None, help="Local cluster: each engine's compute-NIC cap (default none)."
        ),
        max_turns: int = typer.Option(
            None, help="Local cluster: at most this many turns per agent (default: the demo's 6)."
        ),
        node: str = typer.Option(_DEFAULT.node, help=choices_help("Node preset (spec.hardware)", NODES)),
        snic_gbps: float = typer.Option(
            None, help="Each storage NIC's rate in Gbit/s instead of the node preset's."
        ),
        snic_directions: str = typer.Option(
            default_of(SimConfig, "snic_directions"),
            help=choices_help(
                "SNIC model: one link for reads and persists (shared) or one per direction (duplex)",
                SNIC_DIRECTIONS,
            ),
        ),
        pe_scope: str = typer.Option(
            None,
            help=choices_help(
                "PE scope of the scheduler's PE choice (default: the policy's, group): the fetching "
                "group's PEs (group) or every PE group a candidate at each PE fetch (central)",
                PE_SCOPES,
            ),
        ),
        read_tie: str = typer.Option(
            None,
            help=choices_help(
                "Read side on equal PE / DE read queues under the shorter rule (default: pe)", READ_TIES
            ),
        ),
        pe_tie: str = typer.Option(
            None,
            help=choices_help(
                "Order of least-loaded PEs of equal tok_e (default: group order; read-queue: the "
                "smaller node read queue first)",
                PE_TIES,
            ),
        ),
        pe_fetch: str = typer.Option(
            None,
            help=choices_help(
                "When a PE group fetches work (default: boundary): between its iterations, as an "
                "engine loop does (boundary), or on the fetch timer whatever it does (tick)",
                PE_FETCHES,
            ),
        ),
        maxlen: str = typer.Option(
            f"{_WORKLOAD.maxlen // 1024}k", help="Trajectory MaxLen bucket: 32k, 48k or 64k."
        ),
        agents: int = typer.Option(
            None,
            help=f"Number of agents (offline; default {_WORKLOAD.num_agents}, the local cluster: the demo's 6).",
        ),
        system: str = typer.Option(_DEFAULT_SYSTEMS, help=choices_help("Comma list of systems", SYSTEMS)),
        online: bool = typer.Option(False, help="Online: Poisson agent arrivals, capacity sweep."),
        aps: str = typer.Option(DEFAULT_APS, help="Online rates lo:hi:step or a comma list."),
        horizon: float = typer.Option(HORIZON_S, help="Online: seconds of arrivals per rate."),
        trace: str = typer.Option(None, help="Replay a trace (e.g. mooncake) instead of synthetic."),
        append_scale: float = typer.Option(_WORKLOAD.append_scale, help="Scale every append length."),
        gen_scale: float = typer.Option(_WORKLOAD.gen_scale, help="Scale every generation length."),
        dram_buffer_gb: float = typer.Option(None, help="DRAM buffer per node (default per model)."),
        cost_model: str = typer.Option(
            default_of(SimConfig, "cost_model"),
            help=choices_help(
                "Cost model (auto: calibrated when the kernel tables are there, else roofline)",
                SIM_COST_MODELS,
            ),
        ),
        seed: int = typer.Option(default_of(SimConfig, "seed"), help="Seed for the workload and arrivals."),
        out: str = typer.Option(None, help="Folder for per-request CSV records and results."),
        calibrate: list[str] = typer.Option(
            None,
            help="Override a calibration constant for this run, NAME=VALUE (repeatable; "
            "see sim/calibration.py), e.g. --calibrate STORAGE_EFFICIENCY=0.6.",
        ),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        if ctx.invoked_subcommand is not None:
            return
        from dualpath.sim.calibration import DEFAULT_CALIBRATION
        from dualpath.sim.local import parse_local

        if cluster is not None or device is not None:
            from dualpath.cli.sim_local import run_local_cli

            if cluster is None or not parse_local(cluster):
                from dualpath.core.errors import ConfigError

                raise ConfigError("cluster", cluster or "none", "choices: local (with --device profile:FILE)")
            run_local_cli(
                pd=pd, snic_gbps=snic_gbps, cnic_gbps=cnic_gbps,
                snic_directions=snic_directions if snic_directions != default_of(SimConfig, "snic_directions") else None,
                device=device, agents=agents, max_turns=max_turns,
                scale=append_scale if append_scale != _WORKLOAD.append_scale else None,
                max_len=None, system=system, seed=seed, out=out, json_out=json_out, calibrate=calibrate,
            )  # fmt: skip
            return

        run_cli(
            model=model,
            pd=pd or _DEFAULT_PD,
            maxlen=maxlen,
            agents=agents if agents is not None else _WORKLOAD.num_agents,
            system=system,
            online=online,
            aps=aps,
            horizon=horizon,
            trace=trace,
            append_scale=append_scale,
            gen_scale=gen_scale,
            dram_buffer_gb=dram_buffer_gb,
            cost_model=cost_model,
            seed=seed,
            out=out,
            json_out=json_out,
            calibration=DEFAULT_CALIBRATION.with_overrides(calibrate or []),
            node=node,
            snic_gbps=snic_gbps,
            snic_directions=snic_directions,
            pe_scope=pe_scope,
            read_tie=read_tie,
            pe_tie=pe_tie,
            pe_fetch=pe_fetch,
        )

    @sim.command("profile")
    def profile(
        out: str = typer.Option(..., help="Profile file to write (JSON)."),
        model: str = typer.Option("smollm2-135m", help="The engines' model (a name, a path, or tiny)."),
        quick: bool = typer.Option(False, help="A coarse grid (a smoke check, ~10 s with tiny)."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Measure the real engine's step times (serve extra) for --device profile:FILE."""
        from dualpath.cli.sim_local import run_profile_cli

        run_profile_cli(out=out, model=model, quick=quick, json_out=json_out)

    @sim.command("figures")
    def figures(
        out: str = typer.Option("sim_figures", help="Output folder for PNG + CSV/JSON."),
        quick: bool = typer.Option(False, help="Smaller agent counts and horizons."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Regenerate the paper's figures (offline grid, P/D, scaling, online, ablation, ...)."""
        from dualpath.cli._common import print_json
        from dualpath.sim.harness.figures import make_figures

        index = make_figures(out, quick=quick)
        if json_out:
            print_json(index)
        else:
            typer.echo(f"wrote {len(index['files'])} files to {out}")

    @sim.command("fidelity")
    def fidelity(
        quick: bool = typer.Option(
            False,
            help="Agents / 16, 600 s online horizon, coarse rates, "
            "large-scale points on 8P16D / 4P8D (under ~1 min).",
        ),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
        out: str = typer.Option(None, help="Folder for fidelity.csv, fidelity.png, fidelity.json."),
        pe_scope: str = typer.Option(
            None, help=choices_help("PE scope for every run (default: the policies', group)", PE_SCOPES)
        ),
        read_tie: str = typer.Option(
            None, help=choices_help("Read side on equal read queues, every run (default: pe)", READ_TIES)
        ),
        pe_tie: str = typer.Option(
            None, help=choices_help("Order of PEs of equal tok_e, every run (default: group)", PE_TIES)
        ),
        pe_fetch: str = typer.Option(
            None, help=choices_help("When PE groups fetch, every run (default: boundary)", PE_FETCHES)
        ),
        calibrate: list[str] = typer.Option(
            None, help="Override a calibration constant in every run, NAME=VALUE (repeatable)."
        ),
    ) -> None:
        """Run every published point (spec section 10): simulated vs published, relative errors."""
        from dualpath.cli.sim_fidelity import run_fidelity_cli

        run_fidelity_cli(
            quick=quick,
            json_out=json_out,
            out=out,
            calibrate=calibrate,
            pe_scope=pe_scope,
            read_tie=read_tie,
            pe_tie=pe_tie,
            pe_fetch=pe_fetch,
        )

    app.add_typer(sim, name="simulate")


def run_cli(
    *,
    model: str,
    pd: str,
    maxlen: str,
    agents: int,
    system: str,
    online: bool,
    aps: str,
    horizon: float,
    trace: str | None,
    append_scale: float,
    gen_scale: float,
    dram_buffer_gb: float | None,
    cost_model: str,
    seed: int,
    out: str | None,
    json_out: bool,
    calibration: Calibration,
    node: str = _DEFAULT.node,
    snic_gbps: float | None = None,
    snic_directions: str = default_of(SimConfig, "snic_directions"),
    pe_scope: str | None = None,
    read_tie: str | None = None,
    pe_tie: str | None = None,
    pe_fetch: str | None = None,
) -> None:
    import dataclasses

    from rich.console import Console

    from dualpath.cli._common import check_choice, check_scheduler_choices, print_json
    from dualpath.cli.progress import Progress
    from dualpath.core.units import parse_tokens
    from dualpath.sim.config import get_system
    from dualpath.sim.harness.experiments import WorkloadSpec, make_cluster, make_trajectories
    from dualpath.sim.harness.runner import run_one

    systems = [s.strip() for s in system.split(",") if s.strip()]
    for name in systems:
        get_system(name)  # fail early with the choices
    check_choice("cost model", cost_model, SIM_COST_MODELS)
    check_choice("snic_directions", snic_directions, SNIC_DIRECTIONS)
    ties = check_scheduler_choices(pe_scope, read_tie, pe_tie, pe_fetch)
    run_read_tie = read_tie or default_of(SimConfig, "read_tie")
    run_pe_tie = pe_tie or default_of(SimConfig, "pe_tie")
    run_pe_fetch = pe_fetch or default_of(SimConfig, "pe_fetch")
    check_choice("node", node, NODES)
    cluster = dataclasses.replace(
        make_cluster(model, pd, node=node, dram_buffer_gb=dram_buffer_gb), snic_gbps=snic_gbps
    )
    started = time.perf_counter()
    err = Console(stderr=True)
    from dualpath.sim import compiled

    build = compiled.status()
    if build["pure"] and not online and agents * len(systems) >= 4096:
        err.print(f"[dim]note: {compiled.PURE_NOTICE}")
    if build["stale"]:
        err.print(
            f"[yellow]warning: compiled modules older than their source (rebuild with "
            f"DUALPATH_COMPILE=1, or delete the .so files): {', '.join(build['stale'])}"
        )
    result: dict = {
        "model": model,
        "pd": cluster.pd_label,
        "maxlen": maxlen,
        "systems": {},
        "calibration": calibration.as_constants(),
        "calibration_overrides": calibration.overrides(),
        "compiled": not build["pure"],
    }
    # (present only when asked for, so the default runs' JSON stays as it was)
    if node != _DEFAULT.node:
        result["node"] = node
    if snic_gbps is not None:
        result["snic_gbps"] = snic_gbps
    if snic_directions != default_of(SimConfig, "snic_directions"):
        result["snic_directions"] = snic_directions
    if pe_scope is not None:
        result["pe_scope"] = pe_scope
    result.update(ties)
    if online:
        from dualpath.sim.harness.online import capacity_sweep, parse_aps

        rates = parse_aps(aps)
        base = make_trajectories(
            WorkloadSpec(maxlen=parse_tokens(maxlen), num_agents=500, seed=seed, trace=trace)
        )
        result["mode"] = "online"
        ordered = sorted(rates)  # capacity_sweep runs the rates in increasing order
        with Progress("online sweep", total=len(rates) * len(systems), console=err) as bar:
            for k, name in enumerate(systems):
                done = [0]

                def step(name: str = name, done: list[int] = done) -> None:
                    done[0] += 1
                    nxt = f"aps={ordered[done[0]]:g}" if done[0] < len(ordered) else "done"
                    bar.advance(description=f"online {name} {nxt}")

                bar.update(f"online {name} aps={ordered[0]:g}")
                sweep = capacity_sweep(
                    name,
                    cluster,
                    base,
                    rates,
                    horizon_s=horizon,
                    seed=seed,
                    cost_model=cost_model,
                    calibration=calibration,
                    progress=step,
                    snic_directions=snic_directions,
                    pe_scope=pe_scope,
                    read_tie=run_read_tie,
                    pe_tie=run_pe_tie,
                    pe_fetch=run_pe_fetch,
                )
                result["systems"][name] = sweep
                bar.update(completed=(k + 1) * len(rates))  # a sweep stops at the first miss
    else:
        trajs = make_trajectories(
            WorkloadSpec(
                maxlen=parse_tokens(maxlen),
                num_agents=agents,
                seed=seed,
                trace=trace,
                append_scale=append_scale,
                gen_scale=gen_scale,
            )
        )
        result["mode"] = "offline"
        result["agents"] = len(trajs)
        with Progress("simulating", total=len(systems), console=err) as bar:
            for name in systems:
                bar.update(f"simulating {name} ({len(trajs)} agents)")
                cfg = SimConfig(
                    system=get_system(name),
                    cluster=cluster,
                    seed=seed,
                    cost_model=cost_model,
                    out_dir=out,
                    calibration=calibration,
                    snic_directions=snic_directions,
                    pe_scope=pe_scope,
                    read_tie=run_read_tie,
                    pe_tie=run_pe_tie,
                    pe_fetch=run_pe_fetch,
                )
                res = run_one(cfg, trajs)
                jct = res.get("jct_s") or 0.0
                res["requests_per_sim_s"] = res["num_requests"] / jct if jct > 0 else None
                result["systems"][name] = res
                bar.advance()
    result["wall_s"] = time.perf_counter() - started
    result["events"] = sum(
        r.get("events", 0) or sum(p["events"] for p in r.get("points", []))
        for r in result["systems"].values()
    )
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "result.json"), "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2, default=str)
    if json_out:
        print_json(result)
        return
    from dualpath.cli.sim_tables import print_offline, print_online

    if online:
        print_online(result, model, cluster.pd_label)
    else:
        print_offline(result, model, cluster.pd_label, maxlen)

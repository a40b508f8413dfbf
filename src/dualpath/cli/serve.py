"""``dualpath serve`` (scheduler + engines + HTTP API), ``dualpath engine`` (one engine joining a
scheduler, e.g. on another host) and ``dualpath demo`` (Basic vs DualPath vs Oracle on a local 1P2D
cluster)."""

from __future__ import annotations

from typing import Any

import typer

from dualpath.cli._common import (
    check_choice,
    choices_help,
    console,
    default_of,
    print_json,
    require_serve_extra,
)
from dualpath.cli.cluster_setup import (
    check_kv_store,
    cluster_option,
    engine_config,
    require_mooncake_master,
    traffic_config,
)
from dualpath.policy.config import PE_SCOPES, PE_TIES, READ_TIES
from dualpath.policy.scheduler import POLICY_NAMES
from dualpath.runtime.choices import KV_BACKEND_NAMES, ROLES, TRANSPORT_NAMES
from dualpath.runtime.cluster.config import (
    DEMO_SYSTEMS,
    ClusterConfig,
    DemoConfig,
    EngineArgs,
    EngineConfig,
    SchedulerServiceConfig,
    SupervisorConfig,
    TrafficConfig,
)
from dualpath.runtime.server.config import ServerConfig


def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""
    app.command(name="serve")(serve)
    app.command(name="engine")(engine)
    app.command(name="demo")(demo)


_CAPACITY_HELP = (
    "KV store capacity in GB (default: 90% of the free space at start); LRU leaf "
    "blocks are evicted beyond it."
)
_MODE_HELP = "KV block file mode: 0600 (owner only) or 0640 / 0660 for a group sharing the directory."
_QUOTA_HELP = (
    "DualPath PE batches: predicted time per forward pass (ms; what is predicted: --quota-scope), "
    "from a predictor each PE measures at start."
)
_SCOPE_HELP = (
    "What the compute quota bounds: forward (a PE batch's whole forward, so a long prompt is chunked "
    "and never holds the PE for more than about one quota) or attention (the paper's: attention time only)."
)
_KVMEM_HELP = (
    "Each engine's KV memory (paged cache + buffers): bytes (2GiB, 512MiB, 1073741824), a fraction "
    "<= 1 of the memory available at start (0.1), or auto (1 GiB, less for small models)."
)
_MODE = f"{default_of(ClusterConfig, 'kv_file_mode'):04o}"
_BACKEND_HELP = choices_help(
    "Where KV blocks live (posix, nixl-posix: files under --kv-dir; mooncake: Mooncake Store; docs/kvstore.md)",
    KV_BACKEND_NAMES,
)
_MASTER_HELP = "mooncake: an existing mooncake_master's HOST:PORT (empty: serve starts one with a holder)."
_META_HELP = "mooncake: that master's HTTP metadata URL (http://HOST:PORT/metadata)."
_SERVE_STANDBY = 1  # serve keeps one warm spare: a restart in seconds, not a cold model load
_QUOTA_MS = default_of(EngineConfig, "compute_quota_s") * 1e3


def _server_option(name: str, text: str) -> Any:
    return typer.Option(default_of(ServerConfig, name), help=text)


def serve(
    prefill_engines: int = cluster_option("num_prefill_engines", "Prefill engine processes (PEs)."),
    decode_engines: int = cluster_option("num_decode_engines", "Decode engine processes (DEs)."),
    model: str = cluster_option("model", "Model name, HF folder, .gguf, or 'tiny'."),
    kv_dir: str = typer.Option(..., help="Shared KV block directory (a distributed FS for many hosts)."),
    policy: str = cluster_option("policy", choices_help("Scheduling policy", POLICY_NAMES)),
    snic_gbps: float | None = typer.Option(
        default_of(TrafficConfig, "snic_gbps"), help="Emulated storage-NIC cap per node (default: none)."
    ),
    cnic_gbps: float | None = typer.Option(
        default_of(TrafficConfig, "cnic_gbps"), help="Emulated compute-NIC cap per engine (default: none)."
    ),
    storage_read_gbps: float | None = typer.Option(
        default_of(SchedulerServiceConfig, "storage_read_gbps"),
        help="Storage read rate per node behind alpha when no SNIC cap is set (default: measured at start).",
    ),
    engines_per_node: int = cluster_option(
        "engines_per_node", "Engines per emulated node (one group per node)."
    ),
    pe_scope: str | None = typer.Option(
        None,
        help=choices_help("PE scope of the PE choice (default: the policy's, group)", PE_SCOPES),
    ),
    read_tie: str = typer.Option(
        default_of(SchedulerServiceConfig, "read_tie"),
        help=choices_help("Read side on equal PE / DE read queues under the shorter rule", READ_TIES),
    ),
    pe_tie: str = typer.Option(
        default_of(SchedulerServiceConfig, "pe_tie"),
        help=choices_help("Order of least-loaded PEs of equal tok_e", PE_TIES),
    ),
    transport: str = cluster_option("transport", choices_help("KV transport", TRANSPORT_NAMES)),
    host: str = typer.Option(default_of(ServerConfig, "host"), help="HTTP bind address."),
    port: int = typer.Option(default_of(ServerConfig, "port"), help="HTTP port."),
    scheduler_port: int = cluster_option(
        "scheduler_port", "Scheduler port for remote engines (0 = any free)."
    ),
    api_key: str = typer.Option("", help="Require this bearer token (empty = no auth)."),
    compute_quota_ms: float = typer.Option(_QUOTA_MS, help=_QUOTA_HELP),
    quota_scope: str = typer.Option(default_of(EngineConfig, "quota_scope"), help=_SCOPE_HELP),
    kv_cache_memory: str = typer.Option(default_of(EngineConfig, "kv_cache_memory"), help=_KVMEM_HELP),
    kv_capacity_gb: float | None = cluster_option("kv_capacity_gb", _CAPACITY_HELP),
    kv_file_mode: str = typer.Option(_MODE, help=_MODE_HELP),
    kv_backend: str = cluster_option("kv_backend", _BACKEND_HELP),
    mooncake_master: str = typer.Option("", help=_MASTER_HELP),
    mooncake_metadata: str = typer.Option("", help=_META_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (addresses) at start."),
    header_timeout_s: float = _server_option("header_timeout_s", "Seconds to receive a request head."),
    body_timeout_s: float = _server_option(
        "body_timeout_s",
        "Seconds to receive a request body (plus 1 s per "
        f"{default_of(ServerConfig, 'body_min_rate_bytes_per_s'):g} bytes received).",
    ),
    keep_alive_timeout_s: float = _server_option(
        "keep_alive_timeout_s", "Idle seconds after a response before the connection closes."
    ),
    max_connections: int = _server_option(
        "max_connections", "Open HTTP connections (the longest idle one is closed beyond it)."
    ),
    standby: int = typer.Option(
        _SERVE_STANDBY, help="Warm spare engine processes a restart uses (0: none; one model's memory each)."
    ),
    restart_burst: int = typer.Option(
        default_of(SupervisorConfig, "restart_burst"),
        help="Restarts of one process within --restart-interval-s before the cluster gives up on it (unhealthy).",
    ),
    restart_interval_s: float = typer.Option(
        default_of(SupervisorConfig, "restart_interval_s"), help="The window of --restart-burst (seconds)."
    ),
) -> None:
    """Start the scheduler, the engines and the OpenAI-compatible HTTP server; Ctrl-C stops all."""
    require_serve_extra("serve")
    from dualpath.runtime.cluster.sched_guard import key_sha256
    from dualpath.runtime.kvstore.limits import parse_file_mode

    cfg = ClusterConfig(
        kv_dir=kv_dir,
        model=model,
        num_prefill_engines=prefill_engines,
        num_decode_engines=decode_engines,
        engines_per_node=engines_per_node,
        policy=policy,
        transport=transport,
        scheduler_port=scheduler_port,
        kv_capacity_gb=kv_capacity_gb,
        kv_file_mode=parse_file_mode(kv_file_mode),
        kv_backend=kv_backend,
        kv_mooncake_master=mooncake_master,
        kv_mooncake_metadata=mooncake_metadata,
        api_key_sha256=key_sha256(api_key) if api_key else "",
        engine=engine_config(compute_quota_ms, quota_scope, kv_cache_memory),
        traffic=traffic_config(snic_gbps, cnic_gbps),
        supervisor=SupervisorConfig(
            standby=standby, restart_burst=restart_burst, restart_interval_s=restart_interval_s
        ),
        scheduler=_scheduler_config(storage_read_gbps, pe_scope, read_tie, pe_tie),
    )
    limits = {
        "header_timeout_s": header_timeout_s,
        "body_timeout_s": body_timeout_s,
        "keep_alive_timeout_s": keep_alive_timeout_s,
        "max_connections": max_connections,
    }
    _run_serve(cfg, host, port, api_key, json_out, limits)


def _scheduler_config(
    storage_read_gbps: float | None, pe_scope: str | None, read_tie: str, pe_tie: str
) -> SchedulerServiceConfig:
    """serve's scheduler settings, each choice checked (a bad one: an error naming it)."""
    return SchedulerServiceConfig(
        storage_read_gbps=storage_read_gbps,
        pe_scope=None if pe_scope is None else check_choice("pe scope", pe_scope, PE_SCOPES),
        read_tie=check_choice("read tie", read_tie, READ_TIES),
        pe_tie=check_choice("pe tie", pe_tie, PE_TIES),
    )


def _run_serve(
    cfg: ClusterConfig, host: str, port: int, api_key: str, json_out: bool, limits: dict[str, Any]
) -> None:
    """Check everything that can fail before any engine starts, start the cluster, serve HTTP."""
    from dualpath.runtime.cluster.local import LocalCluster

    try:
        from dualpath.runtime.server.run import preflight, run_server
    except ImportError as exc:  # the HTTP layer is optional at import time
        raise typer.BadParameter(f"the HTTP server (dualpath.runtime.server) is unavailable: {exc}") from exc
    if cfg.model != "tiny":  # argument and model errors before any engine starts
        from dualpath.runtime.model.loader import resolve_model

        resolve_model(cfg.model)
    check_kv_store(cfg.kv_backend, cfg.kv_dir)
    tokenizer = preflight(host, port, cfg.model, api_key or None, **limits)
    cluster = LocalCluster(cfg, auth=True)  # CURVE planes; --standby warm spare engines
    try:
        from dualpath.cli.progress import Progress

        with Progress("starting scheduler and engines"):
            cluster.start()
        _print_serve_info(_serve_info(cluster, host, port), cfg.model, cluster, json_out)
        run_server(
            cluster.address,
            host=host,
            port=port,
            model=cfg.model,
            api_key=api_key or None,
            tokenizer=tokenizer,
            cluster_key_file=str(cluster.key_file),
            **limits,
        )
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


def _serve_info(cluster: Any, host: str, port: int) -> dict[str, str]:
    """The addresses serve prints at start (--json: as one object)."""
    info = {
        "url": f"http://{host}:{port}",
        "scheduler": cluster.address,
        "logs": str(cluster.run_dir),
        "key_file": str(cluster.key_file),
        "kv_backend": cluster.config.kv_backend,
    }
    if cluster.config.kv_mooncake_master:  # what remote engines pass as --mooncake-master/-metadata
        info["mooncake_master"] = cluster.config.kv_mooncake_master
        info["mooncake_metadata"] = cluster.config.kv_mooncake_metadata
    return info


def _print_serve_info(info: dict[str, str], model: str, cluster: Any, json_out: bool) -> None:
    if json_out:
        print_json(info)
        return
    console.print(
        f"dualpath serving {model} at {info['url']} (scheduler {cluster.address}, "
        f"CURVE key file {cluster.key_file})",
        style="green",
    )
    if "mooncake_master" in info:
        console.print(
            f"KV blocks in Mooncake Store: --mooncake-master {info['mooncake_master']} "
            f"--mooncake-metadata {info['mooncake_metadata']}",
            highlight=False,
        )
    console.print(
        f"Prometheus metrics at {info['url']}/metrics (Grafana dashboard: "
        "deploy/grafana/dualpath.json, docs/server.md)",
        highlight=False,
    )


def engine(
    role: str = typer.Option(..., help=choices_help("Engine role", ROLES)),
    scheduler: str = typer.Option(..., help="Scheduler HOST:PORT (printed by dualpath serve)."),
    kv_dir: str = typer.Option(..., help="The shared KV block directory (same files as the others)."),
    model: str = cluster_option("model", "Model name, HF folder or .gguf."),
    node_id: int = typer.Option(..., help="Emulated node id (engines of one node form a group)."),
    engine_id: int = typer.Option(
        default_of(EngineArgs, "engine_id"), help="Engine id (-1: the scheduler picks)."
    ),
    host: str = cluster_option("host", "Address peers reach this engine's transport at."),
    transport: str = cluster_option(
        "transport",
        choices_help("KV transport (zmq, mooncake, nixl across hosts; shm on one host)", TRANSPORT_NAMES),
    ),
    policy: str = cluster_option("policy", choices_help("Policy for this PE's batch planning", POLICY_NAMES)),
    snic_gbps: float | None = typer.Option(
        default_of(TrafficConfig, "snic_gbps"), help="Emulated storage-NIC cap of this node (default: none)."
    ),
    cnic_gbps: float | None = typer.Option(
        default_of(TrafficConfig, "cnic_gbps"), help="Emulated compute-NIC cap (default: none)."
    ),
    cluster_id: str = typer.Option(
        default_of(EngineArgs, "cluster_id"),
        help="Engines of one node on one host with the same id share their emulated storage NIC.",
    ),
    compute_quota_ms: float = typer.Option(_QUOTA_MS, help=_QUOTA_HELP),
    quota_scope: str = typer.Option(default_of(EngineConfig, "quota_scope"), help=_SCOPE_HELP),
    kv_cache_memory: str = typer.Option(default_of(EngineConfig, "kv_cache_memory"), help=_KVMEM_HELP),
    kv_capacity_gb: float | None = cluster_option("kv_capacity_gb", _CAPACITY_HELP),
    kv_file_mode: str = typer.Option(_MODE, help=_MODE_HELP),
    kv_backend: str = cluster_option("kv_backend", _BACKEND_HELP),
    mooncake_master: str = typer.Option("", help="mooncake: the cluster's mooncake_master HOST:PORT."),
    mooncake_metadata: str = typer.Option("", help=_META_HELP),
    key_file: str = typer.Option(
        "",
        help="The cluster's CURVE key file (printed by dualpath serve "
        "as key_file; copy it with mode 0600). Empty: an unauthenticated cluster.",
    ),
    restart_on_exit: bool = typer.Option(
        False,
        "--restart-on-exit",
        help="Run the engine as a child and start it again whenever it exits (0.5 s backoff doubling "
        "to 10 s; gives up after --restart-burst restarts within --restart-interval-s). SIGTERM stops it.",
    ),
    restart_burst: int = typer.Option(
        default_of(SupervisorConfig, "restart_burst"),
        help="With --restart-on-exit: restarts before giving up.",
    ),
    restart_interval_s: float = typer.Option(
        default_of(SupervisorConfig, "restart_interval_s"), help="The window of --restart-burst (seconds)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object when it stops."),
) -> None:
    """Run one engine that joins the scheduler at HOST:PORT (blocks until the scheduler stops it;
    with --restart-on-exit, until SIGTERM)."""
    require_serve_extra("engine")
    from dualpath.runtime.kvstore.limits import parse_file_mode

    check_choice("role", role, ROLES)
    cluster = ClusterConfig(
        kv_dir=kv_dir,
        model=model,
        policy=policy,
        transport=transport,
        host=host,
        kv_capacity_gb=kv_capacity_gb,
        kv_file_mode=parse_file_mode(kv_file_mode),
        kv_backend=kv_backend,
        kv_mooncake_master=mooncake_master,
        kv_mooncake_metadata=mooncake_metadata,
        engine=engine_config(compute_quota_ms, quota_scope, kv_cache_memory),
        traffic=traffic_config(snic_gbps, cnic_gbps),
    )
    args = _engine_args(cluster, scheduler, role, node_id, engine_id, cluster_id, key_file)
    sup = SupervisorConfig(restart_burst=restart_burst, restart_interval_s=restart_interval_s)
    status = _run_engine(args, sup if restart_on_exit else None)
    if json_out:
        print_json({"role": role, "scheduler": args.scheduler, "stopped": True, "status": status})
    if status:
        raise typer.Exit(status)


def _engine_args(
    cluster: ClusterConfig,
    scheduler: str,
    role: str,
    node_id: int,
    engine_id: int,
    cluster_id: str,
    key_file: str,
) -> EngineArgs:
    """The engine's arguments, its KV memory and store checked first (an error naming the value)."""
    from dualpath.runtime.cluster.kv_backend import capacity_bytes
    from dualpath.runtime.cluster.memory import check_fits

    require_mooncake_master(cluster.kv_backend, cluster.kv_mooncake_master)
    check_fits(cluster.engine.kv_cache_memory, 1)
    addr = scheduler if scheduler.startswith("tcp://") else f"tcp://{scheduler}"
    return EngineArgs(
        cluster=cluster,
        scheduler=addr,
        role=role,
        node_id=node_id,
        engine_id=engine_id,
        cluster_id=cluster_id,
        kv_capacity_bytes=capacity_bytes(cluster),
        key_file=key_file,
    )


def _run_engine(args: EngineArgs, sup: SupervisorConfig | None) -> int:
    """Run the engine in this process, or (``sup``: --restart-on-exit) as a kept-alive child; its status."""
    if sup is None:
        from dualpath.runtime.cluster.engine_main import run_engine

        run_engine(args)
        return 0
    from dualpath.runtime.cluster.engine_keeper import keep_running

    return keep_running(args, sup)


def _demo_option(name: str, text: str) -> Any:
    return typer.Option(default_of(DemoConfig, name), help=text)


def demo(
    tiny: bool = typer.Option(False, "--tiny", help="Use a small random model (fast)."),
    model: str = _demo_option("model", "Model (ignored with --tiny)."),
    systems: str = typer.Option(
        ",".join(default_of(DemoConfig, "systems")),
        help=choices_help("Comma-separated systems to compare", DEMO_SYSTEMS),
    ),
    agents: int = _demo_option("num_agents", "Concurrent agents."),
    turns: int = _demo_option("max_turns", "Turns per agent (at most)."),
    scale: float = _demo_option("scale", "Scale of the paper's append/generation lengths."),
    max_len: int = _demo_option("max_len", "Context cap per agent (tokens)."),
    snic_gbps: float | None = _demo_option(
        "snic_gbps", "Storage-NIC cap per node (default: per model, runtime.cluster.config.DEMO_SNIC_GBPS)."
    ),
    transport: str = _demo_option("transport", choices_help("KV transport", TRANSPORT_NAMES)),
    kv_backend: str = _demo_option("kv_backend", _BACKEND_HELP),
    seed: int = _demo_option("seed", "Workload seed."),
    allow_failures: bool = typer.Option(
        False, "--allow-failures", help="Exit 0 even when the systems' runs did different work."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Start a local 1P2D cluster with capped storage NICs and run the same agents under each system.

    The systems' rounds are interleaved; a run that did different work prints no JCT ratio and
    exits 1. About 3-5 min on a 2-core CPU shared with other jobs (--tiny: 1-1.5 min); progress
    on stderr."""
    require_serve_extra("demo")
    from dualpath.cli.demo_tables import print_demo

    cfg = DemoConfig(
        model="tiny" if tiny else model,
        systems=tuple(systems.split(",")),
        num_agents=agents,
        max_turns=turns,
        scale=scale,
        max_len=max_len,
        snic_gbps=snic_gbps,
        transport=transport,
        kv_backend=kv_backend,
        seed=seed,
    )
    result = _run_demo_with_progress(cfg)
    if json_out:
        print_json(result)
    else:
        print_demo(result, cfg.model, cfg.snic, agents)
    _fail_on_different_work(result, allow_failures)


def _run_demo_with_progress(cfg: DemoConfig) -> dict[str, Any]:
    """run_demo with a progress bar on stderr, one step per round."""
    from dualpath.cli.demo import run_demo
    from dualpath.cli.progress import Progress

    steps = [-1]  # run_demo says "starting ..." once, then "round <k> ...: <system>" per round

    def said(msg: str) -> None:
        steps[0] += 1
        bar.update(f"dualpath demo: {msg}", completed=steps[0])

    total = len(cfg.systems) * cfg.max_turns + 1  # (at most: agents may have fewer turns)
    with Progress("dualpath demo", total=total) as bar:
        result = run_demo(cfg, progress=said)
        bar.update(completed=total)
    return result


def _fail_on_different_work(result: dict[str, Any], allow_failures: bool) -> None:
    """Systems that did different work: no JCT ratio is a result, so exit 1 (unless --allow-failures)."""
    if not result["comparison"]["same_work"] and not allow_failures:
        typer.echo(
            "error: the systems did different work ("
            + "; ".join(result["comparison"]["problems"])
            + "), so no JCT ratio is a result; --allow-failures exits 0 anyway",
            err=True,
        )
        raise typer.Exit(1)

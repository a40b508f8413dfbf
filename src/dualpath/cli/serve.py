"""``dualpath serve`` (scheduler + engines + HTTP API), ``dualpath engine`` (one engine joining a
scheduler, e.g. on another host) and ``dualpath demo`` (Basic vs DualPath vs Oracle on a local 1P2D
cluster)."""

from __future__ import annotations

import typer

from dualpath.cli._common import console, print_json, require_serve_extra


def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""
    app.command(name="serve")(serve)
    app.command(name="engine")(engine)
    app.command(name="demo")(demo)


_CAPACITY_HELP = ("KV store capacity in GB (0 = 90% of the free space at start); LRU leaf blocks "
                  "are evicted beyond it.")
_MODE_HELP = "KV block file mode: 0600 (owner only) or 0640 / 0660 for a group sharing the directory."


def _capacity_gb(value: float) -> float | None:
    from dualpath.core.errors import ConfigError

    if value < 0:
        raise ConfigError("kv_capacity_gb", value, "must be > 0 (0 = 90% of the free space at start)")
    return value or None


def serve(
    prefill_engines: int = typer.Option(1, help="Prefill engine processes (PEs)."),
    decode_engines: int = typer.Option(2, help="Decode engine processes (DEs)."),
    model: str = typer.Option("smollm2-135m", help="Model name, HF folder, .gguf, or 'tiny'."),
    kv_dir: str = typer.Option(..., help="Shared KV block directory (a distributed FS for many hosts)."),
    policy: str = typer.Option("dualpath", help="Scheduling policy (dualpath, basic, ...)."),
    snic_gbps: float = typer.Option(0.0, help="Emulated storage-NIC cap per node (0 = none)."),
    cnic_gbps: float = typer.Option(0.0, help="Emulated compute-NIC cap per engine (0 = none)."),
    engines_per_node: int = typer.Option(1, help="Engines per emulated node (one group per node)."),
    transport: str = typer.Option("zmq", help="KV transport: zmq, shm, mooncake, nixl."),
    host: str = typer.Option("127.0.0.1", help="HTTP bind address."),
    port: int = typer.Option(8000, help="HTTP port."),
    scheduler_port: int = typer.Option(0, help="Scheduler port for remote engines (0 = any free)."),
    api_key: str = typer.Option("", help="Require this bearer token (empty = no auth)."),
    compute_quota_ms: float = typer.Option(300.0, help="DualPath PE batches: predicted attention "
                                           "time per forward pass, measured at PE start (ms)."),
    kv_capacity_gb: float = typer.Option(0.0, help=_CAPACITY_HELP),
    kv_file_mode: str = typer.Option("0600", help=_MODE_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (addresses) at start."),
) -> None:
    """Start the scheduler, the engines and the OpenAI-compatible HTTP server; Ctrl-C stops all."""
    require_serve_extra("serve")
    from dualpath.runtime.cluster.config import ClusterConfig
    from dualpath.runtime.cluster.local import LocalCluster
    from dualpath.runtime.kvstore.limits import parse_file_mode

    cfg = ClusterConfig(kv_dir=kv_dir, model=model, num_prefill_engines=prefill_engines,
                        num_decode_engines=decode_engines, engines_per_node=engines_per_node,
                        policy=policy, snic_gbps=snic_gbps or None, cnic_gbps=cnic_gbps or None,
                        transport=transport, scheduler_port=scheduler_port,
                        compute_quota_ms=compute_quota_ms, kv_capacity_gb=_capacity_gb(kv_capacity_gb),
                        kv_file_mode=parse_file_mode(kv_file_mode))
    try:
        from dualpath.runtime.server.run import preflight, run_server
    except ImportError as exc:  # the HTTP layer is optional at import time
        raise typer.BadParameter(f"the HTTP server (dualpath.runtime.server) is unavailable: {exc}")
    if model != "tiny":  # argument and model errors before any engine starts
        from dualpath.runtime.model.loader import resolve_model

        resolve_model(model)
    tokenizer = preflight(host, port, model, api_key or None)
    cluster = LocalCluster(cfg, auth=True, standby=True)  # CURVE planes; a warm spare engine
    try:
        from dualpath.cli.progress import Progress

        with Progress("starting scheduler and engines"):
            cluster.start()
        info = {"url": f"http://{host}:{port}", "scheduler": cluster.address, "logs": str(cluster.run_dir),
                "key_file": str(cluster.key_file)}
        if json_out:
            print_json(info)
        else:
            console.print(f"dualpath serving {model} at {info['url']} (scheduler {cluster.address}, "
                          f"CURVE key file {cluster.key_file})", style="green")
            console.print(f"Prometheus metrics at {info['url']}/metrics (Grafana dashboard: "
                          "deploy/grafana/dualpath.json, docs/server.md)", highlight=False)
        run_server(cluster.address, host=host, port=port, model=model, api_key=api_key or None,
                   tokenizer=tokenizer, cluster_key_file=str(cluster.key_file))
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


def engine(
    role: str = typer.Option(..., help="prefill or decode."),
    scheduler: str = typer.Option(..., help="Scheduler HOST:PORT (printed by dualpath serve)."),
    kv_dir: str = typer.Option(..., help="The shared KV block directory (same files as the others)."),
    model: str = typer.Option("smollm2-135m", help="Model name, HF folder or .gguf."),
    node_id: int = typer.Option(..., help="Emulated node id (engines of one node form a group)."),
    engine_id: int = typer.Option(-1, help="Engine id (-1: the scheduler picks)."),
    host: str = typer.Option("127.0.0.1", help="Address peers reach this engine's transport at."),
    transport: str = typer.Option("zmq", help="KV transport: zmq (across hosts) or shm (one host)."),
    policy: str = typer.Option("dualpath", help="Policy for this PE's batch planning."),
    snic_gbps: float = typer.Option(0.0, help="Emulated storage-NIC cap of this node (0 = none)."),
    cnic_gbps: float = typer.Option(0.0, help="Emulated compute-NIC cap (0 = none)."),
    cluster_id: str = typer.Option("default", help="Engines of one node on one host with the same id "
                                   "share their emulated storage NIC."),
    compute_quota_ms: float = typer.Option(300.0, help="DualPath PE batches: predicted attention "
                                           "time per forward pass, measured at PE start (ms)."),
    kv_capacity_gb: float = typer.Option(0.0, help=_CAPACITY_HELP),
    kv_file_mode: str = typer.Option("0600", help=_MODE_HELP),
    key_file: str = typer.Option("", help="The cluster's CURVE key file (printed by dualpath serve "
                                  "as key_file; copy it with mode 0600). Empty: an unauthenticated cluster."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object when it stops."),
) -> None:
    """Run one engine that joins the scheduler at HOST:PORT (blocks until the scheduler stops it)."""
    require_serve_extra("engine")
    from dualpath.core.errors import ConfigError
    from dualpath.runtime.cluster.engine_main import EngineArgs, run_engine
    from dualpath.runtime.kvstore.limits import capacity_from_gb, parse_file_mode

    file_mode = parse_file_mode(kv_file_mode)
    capacity = capacity_from_gb(_capacity_gb(kv_capacity_gb), kv_dir)

    if role not in ("prefill", "decode"):
        raise ConfigError("role", role, "choices: prefill, decode")
    if compute_quota_ms <= 0:
        raise ConfigError("compute_quota_ms", compute_quota_ms, "must be > 0")
    addr = scheduler if scheduler.startswith("tcp://") else f"tcp://{scheduler}"
    run_engine(EngineArgs(scheduler=addr, role=role, node_id=node_id, engine_id=engine_id, model=model,
                          kv_dir=kv_dir, transport=transport, host=host, policy=policy,
                          snic_gbps=snic_gbps or None, cnic_gbps=cnic_gbps or None,
                          cluster_id=cluster_id, compute_quota_s=compute_quota_ms / 1e3,
                          kv_capacity_bytes=capacity, kv_file_mode=file_mode, key_file=key_file))
    if json_out:
        print_json({"role": role, "scheduler": addr, "stopped": True})


def demo(
    tiny: bool = typer.Option(False, "--tiny", help="Use a small random model (fast)."),
    model: str = typer.Option("smollm2-135m", help="Model (ignored with --tiny)."),
    systems: str = typer.Option("basic,dualpath,oracle", help="Comma-separated systems to compare."),
    agents: int = typer.Option(6, help="Concurrent agents."),
    turns: int = typer.Option(6, help="Turns per agent (at most)."),
    scale: float = typer.Option(1 / 16, help="Scale of the paper's append/generation lengths."),
    max_len: int = typer.Option(2048, help="Context cap per agent (tokens)."),
    snic_gbps: float = typer.Option(0.0, help="Storage-NIC cap per node (0 = per-model default)."),
    transport: str = typer.Option("zmq", help="KV transport: zmq or shm."),
    seed: int = typer.Option(0, help="Workload seed."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Start a local 1P2D cluster with capped storage NICs and run the same agents under each system.

    About 2.5 min on a 2-core CPU (--tiny: under a minute); progress on stderr."""
    require_serve_extra("demo")
    from dualpath.cli.demo_tables import print_demo
    from dualpath.cli.progress import Progress
    from dualpath.bench.agents import scaled_turns
    from dualpath.runtime.cluster.demo import DemoConfig, run_demo

    cfg = DemoConfig(model="tiny" if tiny else model, systems=tuple(systems.split(",")),
                     num_agents=agents, max_turns=turns, scale=scale, max_len=max_len,
                     snic_gbps=snic_gbps or None, transport=transport, seed=seed)
    steps = [-1]  # run_demo says "starting ..." once, then "running <system> ..." per system

    def said(msg: str) -> None:
        steps[0] += 1
        bar.update(f"dualpath demo: {msg}", completed=steps[0])

    with Progress("dualpath demo", total=len(cfg.systems) + 1) as bar:
        plans = scaled_turns(cfg.num_agents, max_len=cfg.max_len, max_turns=cfg.max_turns,
                             scale=cfg.scale, seed=cfg.seed)
        result = run_demo(cfg, plans, progress=said)
        bar.update(completed=len(cfg.systems) + 1)
    if json_out:
        print_json(result)
        return
    print_demo(result, cfg.model, cfg.snic, agents)

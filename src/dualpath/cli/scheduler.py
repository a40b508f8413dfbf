"""``dualpath scheduler``: the scheduler service alone, for a cluster whose engines run on other hosts
(each a ``dualpath engine --scheduler HOST:PORT``). ``dualpath serve`` runs a scheduler with local
engines under a supervisor and the HTTP API; this runs only the scheduler's control plane, which
``ClusterClient`` (and ``dualpath.runtime.server``'s HTTP server, pointed at it) talks to."""

from __future__ import annotations

import typer

from dualpath.cli._common import (
    check_choice,
    choices_help,
    console,
    default_of,
    print_json,
    require_serve_extra,
)
from dualpath.cli.cluster_setup import check_kv_store, cluster_option, require_mooncake_master, traffic_config
from dualpath.policy.scheduler import POLICY_NAMES
from dualpath.runtime.choices import KV_BACKEND_NAMES
from dualpath.runtime.cluster.config import ClusterConfig, SchedulerServiceConfig, TrafficConfig


def register(app: typer.Typer) -> None:
    """Add this module's command to the top-level app."""
    app.command(name="scheduler")(scheduler)


def scheduler(
    kv_dir: str = typer.Option(..., help="The shared KV block directory (the engines' --kv-dir)."),
    host: str = cluster_option("host", "Bind address (0.0.0.0: every interface)."),
    port: int = cluster_option("scheduler_port", "Port (0 = any free)."),
    model: str = cluster_option("model", "The engines' --model (it sets beta's default prefill rate)."),
    policy: str = cluster_option("policy", choices_help("Scheduling policy", POLICY_NAMES)),
    snic_gbps: float | None = typer.Option(
        default_of(TrafficConfig, "snic_gbps"), help="Storage-NIC cap per node behind alpha (default: none)."
    ),
    storage_read_gbps: float | None = typer.Option(
        default_of(SchedulerServiceConfig, "storage_read_gbps"),
        help="Storage read rate per node behind alpha when no SNIC cap is set (default: measured).",
    ),
    engine_timeout_s: float = typer.Option(
        default_of(SchedulerServiceConfig, "engine_timeout_s"),
        help="Seconds without a heartbeat after which an engine counts as dead.",
    ),
    key_file: str = typer.Option(
        "", help="The cluster's CURVE key file (mode 0600; every engine gets a copy). Empty: unauthenticated."
    ),
    create_key: bool = typer.Option(
        False, "--create-key", help="Write a fresh cluster keypair to --key-file first (it must not exist)."
    ),
    state_file: str = typer.Option(
        "", help="Keep the operator settings and counters here across restarts of this scheduler."
    ),
    kv_backend: str = typer.Option(
        default_of(ClusterConfig, "kv_backend"),
        help=choices_help(
            "The engines' --kv-backend (where their blocks live; docs/kvstore.md)", KV_BACKEND_NAMES
        ),
    ),
    mooncake_master: str = typer.Option("", help="mooncake: the store's mooncake_master HOST:PORT."),
    mooncake_metadata: str = typer.Option(
        "", help="mooncake: its HTTP metadata URL (http://HOST:PORT/metadata)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (the address) at start."),
) -> None:
    """Run the scheduler service on HOST:PORT until SIGTERM or Ctrl-C; engines join it with
    ``dualpath engine --scheduler HOST:PORT`` (docs/cluster.md, "Engines on separate hosts")."""
    require_serve_extra("scheduler")
    check_choice("policy", policy, POLICY_NAMES)
    if create_key:
        _create_key(key_file)
    require_mooncake_master(kv_backend, mooncake_master)
    check_kv_store(kv_backend, kv_dir)  # (its package missing: one error line naming it, now)
    cluster = ClusterConfig(
        kv_dir=kv_dir,
        model=model,
        policy=policy,
        host=host,
        scheduler_port=port,
        kv_backend=kv_backend,
        kv_mooncake_master=mooncake_master,
        kv_mooncake_metadata=mooncake_metadata,
        traffic=traffic_config(snic_gbps),
        scheduler=SchedulerServiceConfig(
            storage_read_gbps=storage_read_gbps, engine_timeout_s=engine_timeout_s
        ),
    )
    _run_scheduler(cluster, key_file, state_file, json_out)


def _create_key(key_file: str) -> None:
    """--create-key: a fresh cluster keypair at --key-file (which must be given and not exist)."""
    from pathlib import Path

    from dualpath.core.errors import ConfigError
    from dualpath.runtime.transfer.auth import ClusterKeys

    if not key_file:
        raise ConfigError("create_key", True, "needs --key-file (where to write the keypair)")
    if Path(key_file).exists():
        raise ConfigError("key_file", key_file, "exists already; --create-key writes a new one")
    ClusterKeys.generate().write(key_file)


def _run_scheduler(cluster: ClusterConfig, key_file: str, state_file: str, json_out: bool) -> None:
    """Start the service, print its address, serve until SIGTERM or Ctrl-C."""
    import signal

    from dualpath.runtime.cluster.config import SchedulerArgs
    from dualpath.runtime.cluster.scheduler import SchedulerService

    svc = SchedulerService(SchedulerArgs(cluster=cluster, key_file=key_file, state_file=state_file))
    info = {"scheduler": svc.address, "key_file": key_file, "authenticated": bool(key_file)}
    if json_out:
        print_json(info)
    else:
        auth = f"CURVE key file {key_file}" if key_file else "unauthenticated"
        console.print(f"dualpath scheduler at {svc.address} ({auth}; kv dir {cluster.kv_dir})", style="green")

    def stop(*_: object) -> None:
        svc.running = False

    signal.signal(signal.SIGTERM, stop)
    try:
        svc.serve_forever()  # (closes: engines get Shutdown "scheduler stopping")
    except KeyboardInterrupt:
        svc.close()

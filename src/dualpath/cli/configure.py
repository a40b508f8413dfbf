"""``dualpath configure``: change a running cluster's operator settings (policy, the Oracle's free
reads, the storage-NIC cap), or reset them to their defaults, over the scheduler's control plane.
The scheduler keeps them across its restarts and gives them to every engine that (re)registers."""

from __future__ import annotations

import typer

from dualpath.cli._common import check_choice, choices_help, console, print_json, require_serve_extra
from dualpath.policy.scheduler import POLICY_NAMES


def register(app: typer.Typer) -> None:
    """Add this module's command to the top-level app."""
    app.command(name="configure")(configure)


def configure(
    scheduler: str = typer.Option(..., help="Scheduler HOST:PORT (dualpath serve --json prints it)."),
    key_file: str = typer.Option("", help="The cluster's CURVE key file (dualpath serve prints it)."),
    api_key: str = typer.Option("", help="The cluster's API key, where serve has one (--api-key)."),
    policy: str | None = typer.Option(None, help=choices_help("Scheduling policy", POLICY_NAMES)),
    read_free: bool | None = typer.Option(
        None, "--read-free/--no-read-free", help="Storage reads and PD transfers cost no time (the Oracle)."
    ),
    snic_gbps: float | None = typer.Option(None, help="Emulated storage-NIC cap per node (Gbit/s)."),
    reset: str = typer.Option(
        "",
        help="Comma-separated settings back to their defaults: policy (dualpath), read_free (off), "
        "snic_gbps (uncapped).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Change settings of the cluster at SCHEDULER; only while no request is in flight. Settings not
    named keep their values; e.g. ``--reset snic_gbps`` removes a storage-NIC cap."""
    require_serve_extra("configure")
    import asyncio

    from dualpath.core.errors import ConfigError
    from dualpath.runtime.cluster.api import ClusterError
    from dualpath.runtime.cluster.client import ClusterClient
    from dualpath.runtime.cluster.messages import SETTINGS
    from dualpath.runtime.transfer.auth import load_keys

    names = tuple(n.strip() for n in reset.split(",") if n.strip())
    for n in names:
        check_choice("reset", n, SETTINGS)
    if policy is not None:
        check_choice("policy", policy, POLICY_NAMES)
    if snic_gbps is not None and not snic_gbps > 0:
        raise ConfigError("snic_gbps", snic_gbps, "must be > 0 (--reset snic_gbps removes the cap)")
    addr = scheduler if scheduler.startswith("tcp://") else f"tcp://{scheduler}"

    async def main() -> object:
        async with ClusterClient(
            addr, keys=load_keys(key_file), query_timeout_s=30.0, api_key=api_key
        ) as client:
            return await client.configure(policy, read_free=read_free, snic_gbps=snic_gbps, reset=names)

    try:
        health = asyncio.run(main())
    except ClusterError as exc:
        raise ConfigError("configure", scheduler, str(exc)) from None
    out = {"scheduler": addr, "policy": health.policy, "reset": list(names)}  # type: ignore[attr-defined]
    if json_out:
        print_json(out)
    else:
        console.print(
            f"configured {addr}: policy {out['policy']}" + (f"; reset {', '.join(names)}" if names else "")
        )

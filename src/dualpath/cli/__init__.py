"""The ``dualpath`` command line: parse -> config -> driver. Nothing in the package imports this.

Each face owns one module here with a ``register(app)`` function. Heavy imports (torch, fastapi,
the simulator) happen inside command bodies so ``dualpath plan`` starts fast.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="dualpath",
    help="DualPath: dual-path KV-cache loading for agentic LLM inference (serve, simulate, plan).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# One module per face; each defines register(app: typer.Typer) -> None.
_COMMAND_MODULES = (
    "dualpath.cli.tables",
    "dualpath.cli.plan",
    "dualpath.cli.workload",
    "dualpath.cli.simulate",
    "dualpath.cli.runtime",
    "dualpath.cli.serve",
    "dualpath.cli.scheduler",
    "dualpath.cli.configure",
    "dualpath.cli.bench",
    "dualpath.cli.model",
    "dualpath.cli.vllm",
)


@app.command()
def version() -> None:
    """Print the dualpath version."""
    from dualpath import __version__

    typer.echo(__version__)


for _name in _COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def _check_extra(argv: list[str]) -> None:
    """``serve``/``engine``/``demo``/``check`` without the serve extra: the error names the extra
    before option parsing (so ``dualpath serve`` alone says it too); ``--help`` still works."""
    from dualpath.cli._common import SERVE_COMMANDS, require_serve_extra

    words = [a for a in argv if not a.startswith("-")]
    if words and words[0] in SERVE_COMMANDS and not {"--help", "-h"} & set(argv):
        require_serve_extra(words[0])


def main() -> None:
    """Console-script entry point; turns dualpath errors into one clear line and exit code 2."""
    import sys

    from dualpath.core.errors import DualpathError

    try:
        _check_extra(sys.argv[1:])
        app()
    except DualpathError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None

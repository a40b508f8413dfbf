"""cli/option_fields.py: a command's flags are the fields of one dataclass, parsed into one instance."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import typer
from typer.testing import CliRunner

from dualpath.cli.bench_options import BenchOptions
from dualpath.cli.option_fields import command_from, option
from dualpath.cli.sim_options import FidelityOptions, SimulateOptions


@dataclass(frozen=True)
class _Opts:
    rate: float = option(0.5, help="A rate.")
    name: str = option(None, "--name", "-n", help="A name.")
    tags: list[str] = option(None, help="Repeatable.")
    json_out: bool = option(False, "--json", help="JSON.")


def _parse(cls: type, args: list[str], *, context: bool = False) -> object:
    got: list[object] = []
    app = typer.Typer()
    if context:
        app.callback(invoke_without_command=True)(
            command_from(cls, lambda ctx, o: got.append((type(ctx).__name__, o)), context=True)
        )
    else:
        app.command()(command_from(cls, got.append))
    result = CliRunner().invoke(app, args, env={"DUALPATH_API_KEY": None})  # (bench: --api-key)
    assert result.exit_code == 0, result.output
    return got[0]


def test_flags_become_one_instance() -> None:
    assert _parse(_Opts, ["--rate", "2", "-n", "x", "--tags", "a", "--tags", "b", "--json"]) == _Opts(
        rate=2.0, name="x", tags=["a", "b"], json_out=True
    )
    assert _parse(_Opts, []) == _Opts()
    kind, opts = _parse(_Opts, ["--rate", "3"], context=True)  # type: ignore[misc]
    assert kind == "Context" and opts == _Opts(rate=3.0)


def test_the_commands_defaults_are_the_dataclasses() -> None:
    """No flags: the instance typer builds equals the dataclass's own defaults (one source)."""
    for cls in (SimulateOptions, FidelityOptions, BenchOptions):
        assert _parse(cls, []) == cls(), cls.__name__


def test_bench_options_build_the_config_once() -> None:
    cfg = dataclasses.replace(
        BenchOptions(), base_url="http://h:1/", tpot_slo_ms=40.0, maxlen="8k"
    ).to_config()
    assert (cfg.url, cfg.tpot_slo_s, cfg.maxlen) == ("http://h:1", 0.04, 8192)

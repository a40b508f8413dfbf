"""Commands whose options are the fields of one dataclass.

Each field's default is its ``typer.Option`` (``option(...)``: the default, the flag names, the
help), so a command's flags, defaults and help live in one place, and the command receives one
instance of the dataclass instead of a parameter per flag. ``command_from(cls, run)`` builds the
function typer reads: one keyword parameter per field, in field order, typed as the field.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import Any

import typer


def option(default: Any, *param_decls: str, **kwargs: Any) -> Any:
    """A dataclass field whose default is ``default`` and whose flag is
    ``typer.Option(default, *param_decls, **kwargs)``."""
    info = typer.Option(default, *param_decls, **kwargs)
    return dataclasses.field(default=default, metadata={"option": info})


def command_from(
    cls: type, run: Callable[..., Any], *, context: bool = False, doc: str | None = None
) -> Callable[..., Any]:
    """The typer command of the options dataclass ``cls``: typer parses the flags, the command
    calls ``run(cls(...))`` (``context``: ``run(ctx, cls(...))``, with the ``typer.Context``)."""
    hints = typing.get_type_hints(cls)
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("ctx", kw, annotation=typer.Context)] if context else []
    for f in dataclasses.fields(cls):
        params.append(inspect.Parameter(f.name, kw, default=f.metadata["option"], annotation=hints[f.name]))

    def command(**values: Any) -> Any:
        if context:
            ctx = values.pop("ctx")
            return run(ctx, cls(**values))
        return run(cls(**values))

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__name__ = command.__qualname__ = run.__name__
    command.__doc__ = doc if doc is not None else run.__doc__
    return command

"""Shared CLI helpers: JSON output, rich tables that fit the terminal, and the check that a command's
extra is installed."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from dualpath.core.errors import DualpathError

# Piped output (a file, CI logs, `| less`) gets 160 columns instead of rich's 80-column default;
# COLUMNS, when set, wins (rich reads it). Tables wider than the console are split (print_table).
_PIPED = not sys.stdout.isatty() and "COLUMNS" not in os.environ
console = Console(width=160 if _PIPED else None)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def print_json(obj: Mapping[str, Any]) -> None:
    """Print exactly one JSON object on stdout."""
    print(json.dumps(_jsonable(obj), indent=2, sort_keys=False))


def fmt_cell(value: Any) -> str:
    """A table cell: floats to 4 significant digits (thousands separated from 10,000 on), None
    as a dash."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if math.isfinite(value) and abs(value) >= 1e4 else f"{value:.4g}"
    return str(value)


def _min_width(text: str) -> int:
    """Narrowest a cell can get without cutting a word (rich wraps at spaces)."""
    return max((cell_len(w) for w in text.split()), default=0)


def _widths(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> tuple[list[int], list[int]]:
    """(narrowest, natural) content width of each column."""
    lo = [max([_min_width(columns[i]), *(_min_width(r[i]) for r in rows)]) for i in range(len(columns))]
    hi = [max([cell_len(columns[i]), *(cell_len(r[i]) for r in rows)]) for i in range(len(columns))]
    return lo, hi


def _numeric(cells: Iterable[str]) -> bool:
    """Whether every cell is a number or a dash (such columns are right-aligned)."""
    for cell in cells:
        try:
            float(cell.replace(",", "").rstrip("%x"))
        except ValueError:
            if cell not in ("-", ""):
                return False
    return True


def _frame(n: int) -> int:
    """Cells a table of ``n`` columns spends on borders and padding (rich's default box)."""
    return 3 * n + 1


def column_groups(
    columns: Sequence[str], rows: Sequence[Sequence[str]], width: int, key_columns: int = 1
) -> list[list[int]]:
    """Split column indices into groups whose table fits ``width`` cells with no word cut; each
    group repeats the first ``key_columns`` (the row names). One group when everything fits."""
    lo, _ = _widths(columns, rows)
    keys = list(range(min(key_columns, len(columns))))
    groups: list[list[int]] = []
    current: list[int] = []
    for i in range(len(keys), len(columns)):
        group = keys + current + [i]
        if current and sum(lo[j] for j in group) + _frame(len(group)) > width:
            groups.append(keys + current)
            current = []
        current.append(i)
    groups.append(keys + current)
    return groups


def fit_widths(lo: Sequence[int], hi: Sequence[int], width: int, key_columns: int = 1) -> list[int]:
    """Content widths between ``lo`` and ``hi`` that fill at most ``width`` cells: every column
    gets its narrowest, then the key columns and after them the columns closest to their natural
    width are widened first."""
    out = list(lo)
    spare = width - _frame(len(lo)) - sum(lo)
    for i in sorted(range(len(lo)), key=lambda j: (j >= key_columns, hi[j] - lo[j])):
        add = max(0, min(spare, hi[i] - lo[i]))
        out[i] += add
        spare -= add
    return out


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    legend: Sequence[str] = (),
    out: Console | None = None,
    key_columns: int = 1,
    right_align: bool = True,
) -> None:
    """Print rows as one rich table, or as several narrower ones (each repeating the first
    ``key_columns``) when one would not fit the console; headers wrap at spaces, no cell is cut,
    numeric columns are right-aligned (``right_align=False``: none). ``legend`` lines (what
    abbreviations mean) follow the table(s)."""
    con = out if out is not None else console
    cells = [[fmt_cell(v) for v in row] for row in rows]
    groups = column_groups(columns, cells, con.width, key_columns)
    lo, hi = _widths(columns, cells)
    for n, group in enumerate(groups, 1):
        suffix = f" ({n}/{len(groups)})" if len(groups) > 1 else ""
        widths = fit_widths(
            [lo[i] for i in group], [hi[i] for i in group], con.width, min(key_columns, len(group))
        )
        table = Table(title=title + suffix)
        for i, w in zip(group, widths):
            right = right_align and i >= key_columns and _numeric(row[i] for row in cells)
            table.add_column(columns[i], width=w, overflow="fold", justify="right" if right else "left")
        for row in cells:
            table.add_row(*(row[i] for i in group))
        con.print(table)
    for line in legend:
        con.print(line, style="dim", highlight=False, markup=False)


def default_of(cls: type, name: str) -> Any:
    """The default of field ``name`` of a dataclass or msgspec Struct ``cls`` (the CLI reads its
    defaults here instead of retyping them). Raises KeyError for a field without a default."""
    fields = getattr(cls, "__dataclass_fields__", None)
    if fields is not None:
        import dataclasses

        field = fields[name]
        if field.default is not dataclasses.MISSING:
            return field.default
        if field.default_factory is not dataclasses.MISSING:
            return field.default_factory()
        raise KeyError(f"{cls.__name__}.{name} has no default")
    import msgspec

    for info in msgspec.structs.fields(cls):
        if info.name == name:
            if info.default is not msgspec.NODEFAULT:
                return info.default
            if info.default_factory is not msgspec.NODEFAULT:
                return info.default_factory()
            raise KeyError(f"{cls.__name__}.{name} has no default")
    raise KeyError(f"{cls.__name__} has no field {name!r}")


def choices_help(text: str, names: Iterable[str]) -> str:
    """Option help ending in the registry's names: ``"Policy: basic, dualpath, ..."``."""
    return f"{text}: {', '.join(names)}."


def check_choice(kind: str, value: str, names: Iterable[str]) -> str:
    """``value`` if it is one of ``names``, else UnknownNameError (one ``error:`` line, exit 2)."""
    from dualpath.core.errors import UnknownNameError

    names = tuple(names)
    if value not in names:
        raise UnknownNameError(kind, value, names)
    return value


def check_scheduler_choices(
    pe_scope: str | None, read_tie: str | None, pe_tie: str | None, pe_fetch: str | None = None
) -> dict[str, str]:
    """Check the simulate commands' ``--pe-scope`` / ``--read-tie`` / ``--pe-tie`` /
    ``--pe-fetch`` (None: not given); returns the ones given after the scope,
    ``{"read_tie": ..., "pe_tie": ..., "pe_fetch": ...}``."""
    from dualpath.policy.config import PE_SCOPES, PE_TIES, READ_TIES
    from dualpath.sim.config import PE_FETCHES

    if pe_scope is not None:
        check_choice("pe_scope", pe_scope, PE_SCOPES)
    given = (
        ("read_tie", read_tie, READ_TIES),
        ("pe_tie", pe_tie, PE_TIES),
        ("pe_fetch", pe_fetch, PE_FETCHES),
    )
    ties = {}
    for key, value, names in given:
        if value is not None:
            ties[key] = check_choice(key, value, names)
    return ties


# The real system's libraries (pyproject's serve extra; isal is optional, zlib is the fallback).
SERVE_MODULES = (
    "torch",
    "transformers",
    "tokenizers",
    "gguf",
    "safetensors",
    "fastapi",
    "uvicorn",
    "zmq",
    "prometheus_client",
)
SERVE_COMMANDS = ("serve", "engine", "scheduler", "demo", "check", "configure")


class MissingExtraError(DualpathError):
    """A command needs libraries of an extra that is not installed."""


def missing_modules(modules: Sequence[str]) -> list[str]:
    """The top-level modules of ``modules`` that cannot be imported (found without importing)."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def require_serve_extra(command: str) -> None:
    """Raise MissingExtraError (one line naming the pip command) unless the serve extra is there."""
    missing = missing_modules(SERVE_MODULES)
    if missing:
        raise MissingExtraError(
            f"`dualpath {command}` needs the serve extra (missing: "
            f"{', '.join(missing)}): pip install 'dualpath[serve]'"
        )

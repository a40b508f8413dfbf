"""Shared CLI helpers: JSON output, rich tables, and the check that a command's extra is installed."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from dualpath.core.errors import DualpathError

from rich.console import Console
from rich.table import Table

# Piped output (a file, CI logs, `| less`) gets wide tables instead of rich's 80-column default.
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


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row))
    console.print(table)


# The real system's libraries (pyproject's serve extra; isal is optional, zlib is the fallback).
SERVE_MODULES = ("torch", "transformers", "tokenizers", "gguf", "safetensors", "fastapi", "uvicorn",
                 "zmq", "prometheus_client")
SERVE_COMMANDS = ("serve", "engine", "demo", "check")


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
        raise MissingExtraError(f"`dualpath {command}` needs the serve extra (missing: "
                                f"{', '.join(missing)}): pip install 'dualpath[serve]'")

"""Shared CLI helpers: JSON output and rich tables."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

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

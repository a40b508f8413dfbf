"""Exact-key lookup in name -> object tables, with an error that lists the choices."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from dualpath.core.errors import UnknownNameError

T = TypeVar("T")


def lookup(table: Mapping[str, T], name: str, kind: str) -> T:
    """Return ``table[name]``; raise :class:`UnknownNameError` naming ``kind`` and the choices."""
    try:
        return table[name]
    except KeyError:
        raise UnknownNameError(kind, name, table.keys()) from None

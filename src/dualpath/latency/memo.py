"""Kernel-table reads memoised for the simulation: the same GEMM, attention, expert or collective
shape recurs across the iterations of a run and across the rows of a CSV (the decode rows of a
batch read the same GEMMs at every KV length), and each read interpolates a table.

``memo_kernels(kernels)`` returns one process-wide proxy per tables object: it answers exactly
what the tables answer (every other attribute is delegated), reading each distinct call once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from dualpath.cost.kernels import KernelTables

MEMOISED = (
    "gemm",
    "context_attention",
    "generation_attention",
    "mla_module",
    "mla_kernel",
    "moe",
    "collective",
)
_PROXIES: dict[int, tuple[KernelTables, MemoKernels]] = {}


class MemoKernels:
    """Reads of ``tables`` memoised by their arguments (see the module doc)."""

    def __init__(self, tables: KernelTables) -> None:
        self._tables = tables
        self._memo: dict[tuple[object, ...], Any] = {}
        for name in MEMOISED:
            setattr(self, name, self._wrap(name, getattr(tables, name)))
        self.launch_floor_s = tables.launch_floor_s  # a property that scans the GEMM table

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        memo = self._memo

        def call(*args: object, **kwargs: object) -> Any:
            key = (name, args, tuple(sorted(kwargs.items())))
            if key not in memo:
                memo[key] = fn(*args, **kwargs)
            return memo[key]

        return call

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tables, name)


def memo_kernels(tables: KernelTables) -> KernelTables:
    """The memoising proxy of ``tables`` (one per tables object for the process)."""
    entry = _PROXIES.get(id(tables))
    if entry is None or entry[0] is not tables:
        entry = _PROXIES[id(tables)] = (tables, MemoKernels(tables))
    return cast(KernelTables, entry[1])

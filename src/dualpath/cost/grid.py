"""Interpolation over a kernel table's measured grid, one axis at a time, in log-log space.

A :class:`Grid` holds a table's latencies as a tree: the first axis' measured values, each with
the sub-grid of the remaining axes measured at it (tables are not full cross products: a GQA table
has no rows with more KV heads than heads). A query walks the tree axis by axis:

- at a measured value it takes that sub-grid exactly, so every table point is returned exactly;
- between two measured values ``x0 < x < x1`` it evaluates both sub-grids and interpolates
  linearly in (log x, log y): a monotone table gives a monotone, strictly positive result;
- below the smallest value it takes the smallest (a kernel's latency floor: fewer tokens or a
  shorter context do not make a launch cheaper);
- above the largest value it scales the largest by ``(x / x_max) ** growth`` with the axis'
  ``growth`` exponent (1: time proportional to tokens or batch; 2: causal attention in the sequence
  length), and records the axis as extrapolated.

Pure numbers; no I/O. ``Frame`` columns come from cost/tables.py.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dualpath.core.errors import ConfigError

Node = Any  # float (leaf) or tuple[tuple[float, ...], tuple[Node, ...]]


def _log_lerp(x: float, x0: float, x1: float, y0: float, y1: float) -> float:
    frac = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + frac * (math.log(y1) - math.log(y0)))


def _build(points: list[tuple[tuple[float, ...], float]], depth: int, num_axes: int) -> Node:
    if depth == num_axes:
        return sum(y for _, y in points) / len(points)  # repeated measurements: their mean
    groups: dict[float, list[tuple[tuple[float, ...], float]]] = {}
    for key, y in points:
        groups.setdefault(key[depth], []).append((key, y))
    xs = tuple(sorted(groups))
    return xs, tuple(_build(groups[x], depth + 1, num_axes) for x in xs)


@dataclass(frozen=True, slots=True)
class Grid:
    """Latency (seconds) over ``axes``; call it with one value per axis (see the module doc)."""

    axes: tuple[str, ...]
    growth: tuple[float, ...]
    root: Node

    @classmethod
    def from_points(
        cls, axes: Sequence[str], growth: Sequence[float], points: Sequence[tuple[Sequence[float], float]]
    ) -> Grid:
        """``points``: ``(axis values, latency_s)`` pairs; non-positive values are dropped."""
        if len(axes) != len(growth):
            raise ConfigError("growth", tuple(growth), f"needs one exponent per axis {tuple(axes)}")
        clean = [
            (tuple(float(v) for v in key), float(y))
            for key, y in points
            if y > 0 and all(v > 0 for v in key) and len(key) == len(axes)
        ]
        if not clean:
            raise ConfigError("points", len(points), "a grid needs at least one positive point")
        return cls(tuple(axes), tuple(float(g) for g in growth), _build(clean, 0, len(axes)))

    @classmethod
    def from_rows(
        cls, rows: Any, axes: Sequence[str], growth: Sequence[float], y: str = "latency", scale: float = 1e-3
    ) -> Grid:
        """From a ``Frame`` of a kernel table (``latency`` in ms -> seconds by default)."""
        cols = [rows[a].tolist() for a in axes]
        ys = rows[y].tolist()
        return cls.from_points(
            axes, growth, [(tuple(c[i] for c in cols), ys[i] * scale) for i in range(len(ys))]
        )

    def __call__(self, *x: float) -> float:
        return self.evaluate(*x)[0]

    def evaluate(self, *x: float) -> tuple[float, tuple[str, ...]]:
        """``(latency_s, axes extrapolated above their largest measured value)``."""
        if len(x) != len(self.axes):
            raise ConfigError("query", x, f"needs one value per axis {self.axes}")
        out: set[str] = set()
        return self._walk(self.root, 0, x, out), tuple(a for a in self.axes if a in out)

    def _walk(self, node: Node, depth: int, x: Sequence[float], out: set[str]) -> float:
        if depth == len(self.axes):
            return float(node)
        xs, children = node
        value = float(x[depth])
        if value <= xs[0]:
            return self._walk(children[0], depth + 1, x, out)
        if value >= xs[-1]:
            top = self._walk(children[-1], depth + 1, x, out)
            if value > xs[-1]:
                out.add(self.axes[depth])
                return top * (value / xs[-1]) ** self.growth[depth]
            return top
        i = bisect.bisect_left(xs, value)
        if xs[i] == value:
            return self._walk(children[i], depth + 1, x, out)
        y0 = self._walk(children[i - 1], depth + 1, x, out)
        y1 = self._walk(children[i], depth + 1, x, out)
        return _log_lerp(value, xs[i - 1], xs[i], y0, y1)

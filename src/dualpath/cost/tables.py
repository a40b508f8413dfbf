"""Measured kernel tables (aiconfigurator perf-db parquet) and log-log interpolation over them.

Layout: ``<data>/hardware/aiconfigurator-perf-db/<gpu>_sxm/<op>/<framework>/<version>/<table>.parquet``
with ``latency`` in milliseconds (converted to seconds here). NCCL ``message_size`` is an element
count (a ``half`` row at N elements matches an ``int8`` row at 2N), so bytes = size x dtype bytes.

A table is read with pyarrow (the ``calibrated`` extra) into a :class:`Frame` of numpy columns; no
pandas. Only the calibrated cost model reads tables, so the base install does not need pyarrow.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dualpath.core.errors import ConfigError
from dualpath.core.paths import DATA_DIR_ENV
from dualpath.core.paths import data_dir as resolve_data_dir  # noqa: F401 (the name cost callers use)

PERF_DB = Path("hardware") / "aiconfigurator-perf-db"
MS = 1e-3
_FRAMES: dict[Path, Frame] = {}  # parquet path -> Frame, shared by every PerfTables (read-only)
EXTRA_HINT = "pip install 'dualpath[calibrated]'"


def perf_db_dir(data_dir: Path, gpu_name: str) -> Path:
    """Folder of ``gpu_name``'s kernel tables; ConfigError naming the path when absent."""
    path = data_dir / PERF_DB / f"{gpu_name}_sxm"
    if not path.is_dir():
        raise ConfigError(
            "data_dir",
            str(path),
            f"no measured kernel tables for gpu {gpu_name!r} "
            f"(set {DATA_DIR_ENV} or pass data_dir=; h100/h200 have full tables, "
            "b200 attention and MoE only)",
        )
    return path


@dataclass(frozen=True, slots=True)
class Frame:
    """Equal-length numpy columns by name. ``frame["col"]`` is a column; ``frame[mask]`` (a boolean
    array) the matching rows, as a new Frame. Read-only by convention."""

    data: dict[str, np.ndarray]

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self.data)

    def __len__(self) -> int:
        return len(next(iter(self.data.values()))) if self.data else 0

    def __getitem__(self, key: str | np.ndarray) -> Any:
        if isinstance(key, str):
            return self.data[key]
        return Frame({name: col[key] for name, col in self.data.items()})


def read_table(path: Path) -> Frame:
    """One parquet file as a :class:`Frame`; ConfigError naming the extra when pyarrow is absent."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            "kernel table", str(path), f"reading kernel tables needs pyarrow: {EXTRA_HINT}"
        ) from None
    table = pq.read_table(path)
    return Frame({name: table.column(name).to_numpy() for name in table.column_names})


@dataclass(frozen=True, slots=True)
class PerfTables:
    """Lazily loaded tables of one GPU. ``frame(op, table)`` returns a :class:`Frame` or None.
    Frames are cached per file for the whole process and must not be mutated."""

    root: Path

    def path(self, op: str, table: str) -> Path | None:
        hits = sorted((self.root / op).glob(f"*/*/{table}.parquet"))
        return hits[-1] if hits else None

    def frame(self, op: str, table: str) -> Frame | None:
        path = self.path(op, table)
        if path is None:
            return None
        if path not in _FRAMES:
            _FRAMES[path] = read_table(path)
        return _FRAMES[path]


def select(frame: Any, **equal: object) -> Any:
    """Rows of ``frame`` whose columns equal the given values (None if the frame is None/empty)."""
    if frame is None or any(column not in frame.columns for column in equal):
        return None
    mask = None
    for column, value in equal.items():
        hit = frame[column] == value
        mask = hit if mask is None else mask & hit
    rows = frame if mask is None else frame[mask]
    return rows if len(rows) else None


@dataclass(frozen=True, slots=True)
class Curve:
    """y(x) through measured points: log-log linear between points, the first value below the
    range (a kernel's latency floor), and proportional growth ``y_last x x / x_last`` above it."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    @classmethod
    def from_points(cls, points: Iterable[tuple[float, float]]) -> Curve:
        merged: dict[float, list[float]] = {}
        for x, y in points:
            if x > 0 and y > 0:
                merged.setdefault(float(x), []).append(float(y))
        if not merged:
            raise ConfigError("points", [], "a curve needs at least one positive point")
        xs = tuple(sorted(merged))
        return cls(xs, tuple(sum(merged[x]) / len(merged[x]) for x in xs))

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1] * x / xs[-1]
        i = bisect.bisect_right(xs, x)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        if x == x0:  # a measured point: return it exactly
            return y0
        frac = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
        return math.exp(math.log(y0) + frac * (math.log(y1) - math.log(y0)))


@dataclass(frozen=True, slots=True)
class Surface:
    """y(u, x) from curves over x measured at several u: interpolate the two neighbouring curves
    at x, then log-log between them in u (proportional above the largest u, floor below)."""

    us: tuple[float, ...]
    curves: tuple[Curve, ...]

    @classmethod
    def from_rows(cls, rows: Any, u: str, x: str, y: str = "latency", scale: float = MS) -> Surface:
        groups: dict[float, list[tuple[float, float]]] = {}
        for uu, xx, yy in zip(rows[u].tolist(), rows[x].tolist(), rows[y].tolist(), strict=True):
            groups.setdefault(float(uu), []).append((xx, yy * scale))
        keys = tuple(sorted(groups))
        return cls(keys, tuple(Curve.from_points(groups[k]) for k in keys))

    def __call__(self, u: float, x: float) -> float:
        us = self.us
        if u <= us[0]:
            return self.curves[0](x)
        if u >= us[-1]:
            return self.curves[-1](x) * u / us[-1]
        i = bisect.bisect_right(us, u)
        return Curve((us[i - 1], us[i]), (self.curves[i - 1](x), self.curves[i](x)))(u)


def curve_from_rows(rows: Any, x: str, y: str = "latency", scale: float = MS) -> Curve:
    """A :class:`Curve` of column ``y`` (ms -> s by default) over column ``x``."""
    return Curve.from_points(zip(rows[x].tolist(), (v * scale for v in rows[y].tolist()), strict=True))

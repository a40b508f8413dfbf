"""Measured kernel tables (aiconfigurator perf-db parquet) and log-log interpolation over them.

Layout: ``<data>/hardware/aiconfigurator-perf-db/<gpu>_sxm/<op>/<framework>/<version>/<table>.parquet``
with ``latency`` in milliseconds (converted to seconds here). NCCL ``message_size`` is an element
count (a ``half`` row at N elements matches an ``int8`` row at 2N), so bytes = size x dtype bytes.

A table is read with pyarrow (the ``calibrated`` extra) into a :class:`Frame` of numpy columns (strings
as fixed-width unicode); no pandas. The package also ships the H100/H200/B200 tables as numpy archives
(``cost/data/<gpu>_sxm.npz``, made by ``python -m dualpath.cost.bundle build``), read with numpy
alone: :func:`open_tables` uses a data folder's parquet tables when it has them (and pyarrow is
installed), else the bundled ones, so every install gets the same step times.
"""

from __future__ import annotations

import bisect
import math
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dualpath.core.errors import ConfigError
from dualpath.core.paths import DATA_DIR_ENV
from dualpath.core.paths import data_dir as resolve_data_dir

PERF_DB = Path("hardware") / "aiconfigurator-perf-db"
BUNDLE_DIR = Path(__file__).resolve().parent / "data"  # the shipped <gpu>_sxm.npz archives
MS = 1e-3
_FRAMES: dict[str, Frame] = {}  # table file (or archive/key) -> Frame, shared by all (read-only)
_LISTINGS: dict[Path, list[tuple[str, str, str, str]]] = {}  # tables root -> its tables
EXTRA_HINT = "pip install 'dualpath[calibrated]'"


def bundled_path(perf_db: str) -> Path:
    """The shipped archive of ``perf_db``'s tables (``h100_sxm`` -> ``cost/data/h100_sxm.npz``)."""
    return BUNDLE_DIR / f"{perf_db}.npz"


def open_tables(perf_db: str, data_dir: str | Path | None = None) -> PerfTables:
    """``perf_db``'s tables: the data folder's parquet (``data_dir``, else ``$DUALPATH_DATA_DIR``,
    else ``../shared/data``) when it has them and pyarrow can read them, else the bundled archive;
    ConfigError naming the path (or the extra) when neither is there."""
    root = resolve_data_dir(data_dir) / PERF_DB / perf_db
    bundle = bundled_path(perf_db)
    if root.is_dir():
        if _have_pyarrow():
            return PerfTables(root)
        if bundle.is_file():
            return PerfTables(bundle, note=f"pyarrow not installed to read {root}")
        raise ConfigError("kernel tables", str(root), f"reading them needs pyarrow: {EXTRA_HINT}")
    if bundle.is_file():
        return PerfTables(bundle)
    raise ConfigError(
        "data_dir",
        str(root),
        f"no measured kernel tables for {perf_db!r} (the package bundles h100_sxm, h200_sxm and "
        f"b200_sxm; for others set {DATA_DIR_ENV} or pass data_dir=)",
    )


def _have_pyarrow() -> bool:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


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
    return Frame({name: _column(table.column(name).to_numpy()) for name in table.column_names})


def _column(values: np.ndarray) -> np.ndarray:
    """Strings (pyarrow gives objects) as fixed-width unicode, as the bundled archives hold them."""
    return values.astype(str) if values.dtype == object else values


def read_bundle(path: Path) -> dict[str, Frame]:
    """A bundled archive as ``{"<op>/<framework>/<version>/<table>": Frame}`` (numpy only, no
    pickle); columns in the order the archive holds them."""
    columns: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as archive:
        for key in archive.files:
            table, _, column = key.rpartition("/")
            columns.setdefault(table, {})[column] = archive[key]
    return {table: Frame(data) for table, data in columns.items()}


@dataclass(frozen=True, slots=True)
class PerfTables:
    """Lazily loaded tables of one GPU: ``root`` a folder of parquet tables or a bundled ``.npz``.
    ``frame(op, table)`` returns a :class:`Frame` or None (the newest framework/version when
    several). Frames are cached per table for the whole process and must not be mutated."""

    root: Path
    note: str = ""  # why the bundle is used although a data folder has tables

    @property
    def bundled(self) -> bool:
        return self.root.suffix == ".npz"

    @property
    def origin(self) -> str:
        """Where the tables come from, for results: the bundle or the data folder."""
        if self.bundled:
            return f"bundled {self.root.name}" + (f" ({self.note})" if self.note else "")
        return f"data dir {self.root}"

    def listing(self) -> list[tuple[str, str, str, str]]:
        """Every table as ``(op, framework, version, table)``, sorted (cached per root)."""
        if self.root not in _LISTINGS:
            _LISTINGS[self.root] = self._list()
        return _LISTINGS[self.root]

    def _list(self) -> list[tuple[str, str, str, str]]:
        if self.bundled:
            names = {name.rpartition("/")[0] for name in _archive_names(self.root)}
            return sorted(tuple(name.split("/")) for name in names)  # type: ignore[misc]
        return sorted(
            (*p.relative_to(self.root).parent.parts, p.stem)  # type: ignore[misc]
            for p in self.root.glob("*/*/*/*.parquet")
        )

    def frame(self, op: str, table: str) -> Frame | None:
        hits = [t for t in self.listing() if t[0] == op and t[3] == table]
        if not hits:
            return None
        name = "/".join(hits[-1])
        key = f"{self.root}:{name}"
        if key not in _FRAMES:
            if self.bundled:
                for other, frame in read_bundle(self.root).items():
                    _FRAMES.setdefault(f"{self.root}:{other}", frame)
            else:
                _FRAMES[key] = read_table(self.root / f"{name}.parquet")
        return _FRAMES[key]


def _archive_names(path: Path) -> list[str]:
    """The column keys of an archive (its ``.npy`` member names), without reading the arrays."""
    with zipfile.ZipFile(path) as archive:
        return [name.removesuffix(".npy") for name in archive.namelist()]


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

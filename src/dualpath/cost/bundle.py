"""Build the kernel-table archives the package ships: ``python -m dualpath.cost.bundle build``.

Reads each bundled GPU's aiconfigurator perf-db parquet tables (pyarrow, the ``calibrated``
extra) from the data folder and writes ``cost/data/<gpu>_sxm.npz`` (numpy ``savez_compressed``,
no pickle: strings as fixed-width unicode) with every table's columns under
``<op>/<framework>/<version>/<table>/<column>``, plus ``<gpu>_sxm.origin.json``: the upstream
repository, licence, commit and sha256 prefix of each table (from the data folder's MANIFEST.tsv).
cost/tables.py reads the archives with numpy alone when no data folder has the tables.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from dualpath.core.errors import ConfigError
from dualpath.cost.tables import BUNDLE_DIR, PERF_DB, PerfTables, resolve_data_dir

# h100_sxm: the paper's node (the simulator's default) and `plan latency`'s default system
BUNDLED_GPUS = ("h100_sxm", "h200_sxm", "b200_sxm")
ORIGIN_REPO = "ai-dynamo/aiconfigurator"
LICENSE = "Apache-2.0"

app = typer.Typer(add_completion=False, help=__doc__)


def manifest_rows(data_dir: Path) -> dict[str, dict[str, str]]:
    """MANIFEST.tsv of the data folder by path (empty when it has none)."""
    path = data_dir / "MANIFEST.tsv"
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8", newline="") as handle:
        return {row["path"]: row for row in csv.DictReader(handle, delimiter="\t")}


def build_one(data_dir: Path, perf_db: str, out_dir: Path) -> tuple[Path, int]:
    """Write ``perf_db``'s archive and origin record; returns the archive path and table count."""
    root = data_dir / PERF_DB / perf_db
    if not root.is_dir():
        raise ConfigError("data_dir", str(root), f"no kernel tables for {perf_db!r} to bundle")
    tables = PerfTables(root)
    manifest = manifest_rows(data_dir)
    arrays: dict[str, np.ndarray] = {}
    origin: list[dict[str, object]] = []
    for op, framework, version, table in tables.listing():
        frame = tables.frame(op, table)
        assert frame is not None
        name = f"{op}/{framework}/{version}/{table}"
        for column in frame.columns:
            arrays[f"{name}/{column}"] = np.ascontiguousarray(frame[column])
        rel = (PERF_DB / perf_db / f"{name}.parquet").as_posix()
        row = manifest.get(rel, {})
        origin.append(
            {
                "table": name,
                "rows": len(frame),
                "origin_path": row.get("origin_path", ""),
                "commit": row.get("commit", ""),
                "sha256_prefix": row.get("sha256_prefix", ""),
            }
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / f"{perf_db}.npz"
    np.savez_compressed(archive, **arrays)  # type: ignore[arg-type]
    record = {"origin_repo": ORIGIN_REPO, "license": LICENSE, "gpu": perf_db, "tables": origin}
    json_path = out_dir / f"{perf_db}.origin.json"
    json_path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return archive, len(origin)


@app.command()
def build(
    data_dir: Annotated[
        Path | None, typer.Option(help="Shared data folder (default $DUALPATH_DATA_DIR).")
    ] = None,
    out_dir: Annotated[Path, typer.Option(help="Where the archives go.")] = BUNDLE_DIR,
) -> None:
    """Convert the bundled GPUs' parquet tables into npz archives (needs pyarrow)."""
    root = resolve_data_dir(data_dir)
    try:
        for perf_db in BUNDLED_GPUS:
            archive, count = build_one(root, perf_db, out_dir)
            size_kib = archive.stat().st_size / 1024
            typer.echo(f"{archive}: {count} tables, {size_kib:.0f} KiB")
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.callback()
def _main() -> None:
    """Kernel-table bundle tools."""


if __name__ == "__main__":
    app()

"""Where the shared data (traces, kernel tables, hardware files) lives; resolved, never hardcoded."""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "DUALPATH_DATA_DIR"


def repo_root() -> Path:
    """The checkout holding ``src/dualpath`` (this file is ``src/dualpath/core/paths.py``)."""
    return Path(__file__).resolve().parents[3]


def data_dir(override: str | Path | None = None) -> Path:
    """``override``, else ``$DUALPATH_DATA_DIR``, else ``<repo root>/../shared/data``. No I/O.

    The last is only meaningful in a checkout (``src/dualpath``); an installed package has no repo
    root beside the data, so it needs ``$DUALPATH_DATA_DIR`` (readers say so when a file is absent)."""
    if override is not None:
        return Path(override)
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env)
    return repo_root().parent / "shared" / "data"

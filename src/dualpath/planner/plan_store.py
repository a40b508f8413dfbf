"""A folder of finished plans, so that a stopped figure run resumes where it was (``--resume DIR``).

Each plan :class:`~dualpath.planner.report.PlanCache` runs is written as one pickle file named by
the SHA-1 of its config key, under a sub-folder named by the SHA-1 of the ``dualpath`` package's
source (every ``.py`` file): plans made by other code are never read back, they only sit in
another sub-folder. A run that finds a plan there takes it instead of planning it again; plans are
deterministic, so the files it writes are the same (``tests/planner/test_figures.py``). The files
are this machine's own output, read back by the process that wrote them or a later run of it.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from functools import cache
from pathlib import Path
from typing import Any

import dualpath


@cache
def code_digest() -> str:
    """SHA-1 of every ``.py`` file of the installed ``dualpath`` package (path and content)."""
    root = Path(dualpath.__file__).parent
    h = hashlib.sha1()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


class PlanStore:
    """Finished plans under ``folder/<code digest>/<key digest>.pkl``: (result, error args)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder) / code_digest()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.loaded = 0  # plans taken from the folder

    def _path(self, key: tuple) -> Path:
        return self.folder / (hashlib.sha1(repr(key).encode()).hexdigest() + ".pkl")

    def get(self, key: tuple) -> tuple[dict | None, tuple | None] | None:
        path = self._path(key)
        if not path.is_file():
            return None
        with path.open("rb") as fh:
            stored_key, value = pickle.load(fh)
        if stored_key != repr(key):  # a digest collision: plan it again
            return None
        self.loaded += 1
        return value

    def put(self, key: tuple, result: dict | None, error: tuple | None) -> None:
        """Write atomically (a temporary file renamed), so a stopped run leaves no half file."""
        path = self._path(key)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        value: tuple[Any, Any] = (repr(key), (result, error))
        with tmp.open("wb") as fh:
            pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
        tmp.replace(path)

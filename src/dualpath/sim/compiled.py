"""Is this process running the mypyc-compiled simulator (``setup.py``, ``DUALPATH_COMPILE=1``)?

``status()`` reports, for each module of the compiled set, whether it was loaded from an extension
module, and which extension modules are older than their ``.py`` source (an in-place build that was
not rebuilt after an edit: the extension still wins the import, so the edit would be silently
ignored). The CLI warns about stale ones and records ``compiled`` in ``--json``.
"""

from __future__ import annotations

import importlib
import os

MODULES: tuple[str, ...] = (
    "dualpath.policy.batch", "dualpath.policy.decode", "dualpath.policy.metrics",
    "dualpath.policy.prefill", "dualpath.policy.scheduler", "dualpath.policy.views",
    "dualpath.sim.adapter", "dualpath.sim.cluster", "dualpath.sim.costs", "dualpath.sim.decode",
    "dualpath.sim.driver", "dualpath.sim.kernel", "dualpath.sim.links", "dualpath.sim.metrics",
    "dualpath.sim.prefill", "dualpath.sim.request", "dualpath.sim.storage",
)


def status() -> dict:
    """``{"compiled": [...], "pure": [...], "stale": [...]}`` over ``MODULES`` (module names)."""
    out: dict[str, list[str]] = {"compiled": [], "pure": [], "stale": []}
    for name in MODULES:
        path = getattr(importlib.import_module(name), "__file__", "") or ""
        if path.endswith(".py"):
            out["pure"].append(name)
            continue
        out["compiled"].append(name)
        source = os.path.join(os.path.dirname(path), name.rsplit(".", 1)[1] + ".py")
        if os.path.exists(source) and os.path.getmtime(source) > os.path.getmtime(path):
            out["stale"].append(name)
    return out


def is_compiled() -> bool:
    """True when every module of the compiled set is an extension module."""
    st = status()
    return not st["pure"]

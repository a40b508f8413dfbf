"""Is this process running the mypyc-compiled simulator (``setup.py``: ``pip install .``)?

``MODULES`` is the compiled set: one self-contained group (the policy's decision modules, the
simulator's kernel, links, units and driver) that ``setup.py`` compiles at install when a C compiler
is there (an editable install stays pure Python). The same source runs in both builds and gives the
same results. Two spellings in these modules exist for mypyc alone:

- ``x[i] = x[i] + v`` rather than ``x[i] += v`` on ``list[int]`` / ``dict[..., int]`` items: mypyc
  compiles the augmented form to generic ``PyNumber_InPlaceAdd`` on boxed objects and the plain
  form to tagged-integer arithmetic (checked with mypy 2.4). Keep the plain form in hot loops.
- The policy's views and plans (``policy/views.py``) are ``msgspec.Struct`` records, not
  dataclasses: a dataclass's generated ``__init__`` runs interpreted even under mypyc (~25x a
  native one). ``views`` and ``predictor`` stay out of this set: compiling them measured no faster
  (the records are not native classes either way; the quota batcher's forward predictor is the
  policy's ``ForwardAttentionPredictor`` over the simulator's memo), and the runtime subclasses
  ``ForwardAttentionPredictor``, which a compiled class would refuse.

``status()`` reports, for each module of the compiled set, whether it was loaded from an extension
module, and which extension modules are older than their ``.py`` source (an in-place build that was
not rebuilt after an edit: the extension still wins the import, so the edit would be silently
ignored). The CLI warns about stale ones and records ``compiled`` in ``--json``.
"""

from __future__ import annotations

import importlib
import os

MODULES: tuple[str, ...] = (
    "dualpath.policy.batch",
    "dualpath.policy.decode",
    "dualpath.policy.fetch",
    "dualpath.policy.fetch_kernels",
    "dualpath.policy.ledger",
    "dualpath.policy.ledger_views",
    "dualpath.policy.metrics",
    "dualpath.policy.prefill",
    "dualpath.policy.scheduler",
    "dualpath.sim.adapter",
    "dualpath.sim.cluster",
    "dualpath.sim.costs",
    "dualpath.sim.decode",
    "dualpath.sim.driver",
    "dualpath.sim.kernel",
    "dualpath.sim.links",
    "dualpath.sim.load_path",
    "dualpath.sim.metrics",
    "dualpath.sim.prefill",
    "dualpath.sim.request",
    "dualpath.sim.storage",
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
        # Only an in-place build in a source checkout can go stale; an installed wheel's files
        # get install-time mtimes in no particular order.
        if (
            _in_checkout(path)
            and os.path.exists(source)
            and os.path.getmtime(source) > os.path.getmtime(path)
        ):
            out["stale"].append(name)
    return out


def _in_checkout(path: str) -> bool:
    """Is ``path`` (a module file) inside a source checkout's ``src/dualpath``?"""
    parts = os.path.abspath(path).split(os.sep)
    if "src" not in parts:
        return False
    root = os.sep.join(parts[: len(parts) - 1 - parts[::-1].index("src")])
    return os.path.exists(os.path.join(root, "setup.py"))


PURE_NOTICE = (
    "pure-Python simulator (same results as the compiled one, ~4x slower): reinstall "
    "with `pip install .` where a C compiler is present (an editable install stays pure "
    "Python); docs/sim.md, Speed"
)


def is_compiled() -> bool:
    """True when every module of the compiled set is an extension module."""
    st = status()
    return not st["pure"]


def source_root() -> str:
    """The source checkout this package runs from (the folder holding ``setup.py`` and ``src/``)."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    root = os.path.dirname(here)
    if os.path.basename(here) != "src" or not os.path.exists(os.path.join(root, "setup.py")):
        raise FileNotFoundError(
            f"{here}: not a source checkout (no ../setup.py); build a compiled "
            "copy from a git clone of dualpath"
        )
    return root


def build_copy(dest: str, python: str | None = None) -> str:
    """Copy this checkout's ``src/`` and ``setup.py`` into ``dest`` and build the compiled modules
    there in place (mypyc, ~30 s). Returns the copy's ``src`` folder, for ``PYTHONPATH``. Leaves
    the checkout itself pure Python (an in-place build there would shadow every later edit)."""
    import shutil
    import subprocess
    import sys

    root = source_root()
    src = os.path.join(dest, "src")
    shutil.copytree(
        os.path.join(root, "src"), src, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info")
    )
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy(os.path.join(root, name), dest)
    env = {**os.environ, "DUALPATH_COMPILE": "1"}
    proc = subprocess.run(
        [python or sys.executable, "setup.py", "build_ext", "--inplace"],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise RuntimeError(f"mypyc build in {dest} failed (exit {proc.returncode}):\n{tail}")
    return src


def main() -> None:
    """``python -m dualpath.sim.compiled``: which build runs, module by module."""
    st = status()
    print("compiled" if not st["pure"] else PURE_NOTICE if not st["compiled"] else "mixed build")
    for kind in ("compiled", "pure", "stale"):
        if st[kind]:
            print(f"{kind}: {', '.join(st[kind])}")


if __name__ == "__main__":
    main()

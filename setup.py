"""Optional compiled build of the simulator's hot path (mypyc).

``pip install .`` (and the README's editable install) is pure Python. ``DUALPATH_COMPILE=1 pip install .``
compiles the simulator's per-request path with mypyc (same source, same results, faster simulations):
the modules listed in ``src/dualpath/sim/compiled.py``. Modules that must stay dynamic (protocols,
config dataclasses with forward references, the CLI) are left out. See docs/sim.md "Speed".
"""

import importlib.util
import os

from setuptools import setup


def _compiled_modules() -> list[str]:
    """Source paths of ``dualpath.sim.compiled.MODULES`` (one list, read from that file)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "src/dualpath/sim/compiled.py")
    spec = importlib.util.spec_from_file_location("_dualpath_compiled", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return ["src/" + name.replace(".", "/") + ".py" for name in module.MODULES]


def _ext_modules() -> list:
    flag = os.environ.get("DUALPATH_COMPILE", "0")
    if flag not in ("0", "1"):
        raise SystemExit(f"DUALPATH_COMPILE={flag!r}: must be 0 (pure Python) or 1 (mypyc build)")
    if flag == "0":
        return []
    from mypyc.build import mypycify

    return mypycify(_compiled_modules(), opt_level="3", debug_level="1")


setup(ext_modules=_ext_modules())

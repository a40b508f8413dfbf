"""Build: the simulator's hot path compiled with mypyc at install, pure Python where that fails.

``pip install .`` compiles the modules listed in ``src/dualpath/sim/compiled.py`` (same source, same
results, ~4x faster simulations) when mypyc (a build requirement) and a C compiler are there; if the
compilation fails it prints why and installs pure Python. An editable install (``pip install -e .``)
stays pure Python: an in-place build would shadow every later edit of those modules.
``DUALPATH_COMPILE``: unset or ``auto`` (the above), ``1`` (always compile, also editable, and fail
on any error), ``0`` (pure Python). ``python -m dualpath.sim.compiled`` says which build runs. See
docs/sim.md "Speed".
"""

import importlib.util
import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

_BUILDS = {"bdist_wheel", "build", "build_ext", "install", "editable_wheel", "develop"}
_EDITABLE = {"editable_wheel", "develop"}


def _notice(text: str) -> None:
    print(f"dualpath: {text}", file=sys.stderr, flush=True)


def _compiled_modules() -> list[str]:
    """Source paths of ``dualpath.sim.compiled.MODULES`` (one list, read from that file)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "src/dualpath/sim/compiled.py")
    spec = importlib.util.spec_from_file_location("_dualpath_compiled", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return ["src/" + name.replace(".", "/") + ".py" for name in module.MODULES]


def _mode() -> str:
    """``compile`` (fail on errors), ``try`` (fall back to pure Python) or ``pure``."""
    flag = os.environ.get("DUALPATH_COMPILE", "auto")
    if flag not in ("auto", "0", "1"):
        raise SystemExit(f"DUALPATH_COMPILE={flag!r}: must be auto (default), 0 (pure Python) or 1 (mypyc)")
    commands = set(sys.argv[1:])
    if flag == "0" or not commands & _BUILDS:  # metadata-only runs (egg_info, dist_info) build nothing
        return "pure"
    if flag == "1":
        return "compile"
    if commands & _EDITABLE:
        _notice("editable install: pure-Python simulator (an in-place compiled build would shadow "
                "edits); DUALPATH_COMPILE=1 compiles it anyway, `pip install .` compiles it")
        return "pure"
    return "try"


class _BuildExtOrFallBack(build_ext):
    """``build_ext`` that, in ``try`` mode, turns a failed compilation into a pure-Python install."""

    fall_back = False

    def run(self) -> None:
        if not self.fall_back:
            super().run()
            return
        try:
            super().run()
        except Exception as exc:  # a missing or failing C compiler: distutils/setuptools errors
            for path in self.get_outputs():
                if os.path.exists(path):
                    os.remove(path)
            self.extensions = []
            _notice(f"compiling the simulator failed ({type(exc).__name__}: {exc}); installed the "
                    "pure-Python simulator instead (same results, ~4x slower). Install a C compiler "
                    "and the Python headers and reinstall for the compiled one.")


def _ext_modules(mode: str) -> list:
    if mode == "pure":
        return []
    try:
        from mypyc.build import mypycify

        return mypycify(_compiled_modules(), opt_level="3", debug_level="1")
    except (Exception, SystemExit) as exc:  # mypyc exits on a type error
        if mode == "compile":
            raise
        _notice(f"mypyc could not compile the simulator ({type(exc).__name__}: {exc}); installing "
                "the pure-Python simulator (same results, ~4x slower)")
        return []


_MODE = _mode()
_BuildExtOrFallBack.fall_back = _MODE == "try"
setup(ext_modules=_ext_modules(_MODE), cmdclass={"build_ext": _BuildExtOrFallBack})

"""The mypyc build (setup.py, DUALPATH_COMPILE=1) gives the same simulations as pure Python.

One module-scoped build of this checkout into a temporary folder (~30 s); then (1) the simulator and
policy tests and the runtime scheduler's trace conformance run against it in a child process, and
(2) a small run of every system gives the same JSON numbers as this (pure Python) process.
Skipped only where no C compiler or mypyc is available; a failing build fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from dualpath.sim import compiled

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RUN = """
import json, sys
from dualpath.sim.compiled import is_compiled
from dualpath.sim.config import SYSTEMS
from dualpath.sim.harness.experiments import WorkloadSpec, make_cluster, make_trajectories
from dualpath.sim.harness.runner import run_systems
trajs = make_trajectories(WorkloadSpec(maxlen=65536, num_agents=48, seed=1))
res = run_systems(sorted(SYSTEMS), make_cluster("deepseek-v3.2", "2p4d"), trajs)
res.update({"ds-27b " + k: v for k, v in run_systems(["basic", "dualpath"], make_cluster("ds-27b", "1p1d"), trajs[:16]).items()})
for r in res.values():
    r.pop("wall_s"); r.pop("requests_per_wall_s")
print(json.dumps({"compiled": is_compiled(), "results": res}, sort_keys=True, default=str))
"""


def _buildable() -> str | None:
    if os.environ.get("DUALPATH_COMPILE") == "1" or compiled.is_compiled():
        return "this process already runs a compiled build"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        return "no Python headers"
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return "mypyc not installed (pip install mypy)"
    return None


pytestmark = pytest.mark.skipif(_buildable() is not None, reason=str(_buildable()))


@pytest.fixture(scope="module")
def compiled_src(tmp_path_factory) -> str:
    return compiled.build_copy(str(tmp_path_factory.mktemp("mypyc")))


def _env(src: str) -> dict:
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_compiled_build_gives_identical_results(compiled_src: str) -> None:
    child = subprocess.run(
        [sys.executable, "-c", RUN],
        env=_env(compiled_src),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    fast = json.loads(child.stdout)
    assert fast["compiled"] is True
    pure = subprocess.run([sys.executable, "-c", RUN], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert pure.returncode == 0, pure.stderr[-3000:]
    slow = json.loads(pure.stdout)
    assert slow["compiled"] is False
    assert set(fast["results"]) == set(slow["results"])
    for system, res in slow["results"].items():
        assert fast["results"][system] == res, system


def test_sim_and_policy_tests_pass_on_the_compiled_build(compiled_src: str) -> None:
    tests = [
        os.path.join(ROOT, "tests", "sim"),
        os.path.join(ROOT, "tests", "policy"),
        os.path.join(ROOT, "tests", "runtime", "cluster", "test_conformance_adapter.py"),
    ]
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *tests,
            f"--ignore={os.path.join(ROOT, 'tests', 'sim', 'test_compiled_build.py')}",
        ],
        env=_env(compiled_src),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert child.returncode == 0, child.stdout[-4000:]
    assert " passed" in child.stdout

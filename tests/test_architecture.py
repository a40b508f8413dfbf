"""Keeps the dependency rules of docs/architecture (shared/docs/architecture.md) and docs/ true.

policy/cost/analysis import only core and spec; spec imports only core, workload only core
(docs/workload.md), core nothing of ours; the simulator's model (``sim/`` outside ``sim/harness/``)
imports core, spec, policy and cost, never workload, the harness, runtime, planner or bench; the
harness (``sim/harness/``: experiments, runs, figures) may add workload and the model; runtime
imports core, spec and policy (never workload: agent replay is bench's); planner imports cost and
the sim model. No heavy runtime library (torch, fastapi, zmq, uvicorn, asyncio servers) outside
runtime/ and bench/; policy reads no clock and runs no threads or processes, and the sim model reads
no wall clock (its kernel is the clock); nothing imports the CLI; no relative imports (the rules
read absolute names); the serve extra's libraries (pyproject ``serve``) only under runtime/, so the
base install runs every other command; bench/ may use httpx (a base dependency) and nothing heavier.
Inside the sim model, the units (prefill, decode, cluster, storage, metrics, load path, ...) never
import the driver: they get narrow collaborators. No import circles anywhere in the house, however
lazy the import (a function body, ``TYPE_CHECKING``), save the ones issue 28 is removing
(``ALLOWED_CIRCLES``, each with its step).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "dualpath"
HEAVY = {"torch", "fastapi", "zmq", "uvicorn", "starlette", "asyncio", "transformers", "httpx"}

# area -> dualpath areas it may import (besides itself); an area is a top-level package, except that
# sim/harness/ ("sim.harness") is apart from the model (the rest of sim/, "sim")
ALLOWED = {
    "core": set(),
    "spec": {"core"},
    "policy": {"core", "spec"},
    "cost": {"core", "spec"},
    "analysis": {"core", "spec"},
    "workload": {"core"},
    "sim": {"core", "spec", "policy", "cost"},
    "sim.harness": {"core", "spec", "policy", "cost", "workload", "sim"},
    "planner": {"core", "spec", "cost", "sim", "workload"},
    # the benchmark a `plan latency` row measured: engines stepped on the sim event kernel
    "latency": {"core", "spec", "cost", "sim"},
    "runtime": {"core", "spec", "policy"},
    "bench": {"core", "spec", "workload"},
    # engine integrations (vLLM connector) reuse the runtime's store; only they may import vllm
    "integrations": {"core", "spec", "policy", "cost", "runtime"},
}
# standard-library modules a pure area never imports: clocks, threads, processes, sockets
IMPURE = {
    "time",
    "datetime",
    "asyncio",
    "threading",
    "multiprocessing",
    "concurrent",
    "socket",
    "select",
    "selectors",
    "signal",
    "subprocess",
}
NO_STDLIB = {
    "policy": IMPURE | {"os"},
    "sim": {"time", "datetime", "asyncio", "threading", "socket"},
    "latency": {"time", "datetime", "asyncio", "threading", "socket"},  # the kernel is its clock
}
# sim model modules that may import the driver (the policy adapter's back-pointer: ledger work)
SIM_DRIVER_IMPORTERS = {"adapter.py", "driver.py"}
LIGHT = {"core", "spec", "policy", "cost", "analysis", "workload", "sim", "planner", "latency"}
# pyproject's serve extra, by import name (pyzmq -> zmq, prometheus-client -> prometheus_client)
SERVE_EXTRA = {
    "torch",
    "transformers",
    "fastapi",
    "uvicorn",
    "starlette",
    "zmq",
    "prometheus_client",
    "safetensors",
    "gguf",
    "tokenizers",
    "isal",
}
# pyproject's base dependencies and the standard library are all a base install has
BASE = {"numpy", "typer", "rich", "msgspec", "matplotlib", "httpx"}
OPTIONAL_ELSEWHERE = {"pyarrow"}  # the calibrated extra: cost/tables.py reads kernel tables with it


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _area(parts: tuple[str, ...] | list[str]) -> str:
    """The area of a module path below ``dualpath`` (``("sim", "harness", "x.py")`` -> "sim.harness")."""
    if len(parts) > 2 and parts[0] == "sim" and parts[1] == "harness":
        return "sim.harness"
    return parts[0] if len(parts) > 1 else ""


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        out.append((_area(path.relative_to(SRC).parts), path))
    return out


@pytest.mark.parametrize("top,path", _modules(), ids=lambda v: str(v))
def test_dependency_rules(top: str, path: Path) -> None:
    for name in _imports(path):
        parts = name.split(".")
        if parts[0] == "dualpath" and len(parts) > 1:
            area = _area([*parts[1:], ""])
            assert area != "cli" or top == "cli", f"{path} imports the CLI ({name})"
            if top in ALLOWED and area != top:
                assert area in ALLOWED[top], f"{path}: {top} may not import dualpath.{area}"
        if top in LIGHT:
            assert parts[0] not in HEAVY, f"{path}: {top}/ may not import {parts[0]}"
        assert parts[0] not in NO_STDLIB.get(top, set()), f"{path}: {top} may not import {name}"
        if top == "sim" and path.name not in SIM_DRIVER_IMPORTERS:
            assert name != "dualpath.sim.driver", f"{path}: a sim unit imports the driver"


@pytest.mark.parametrize("top,path", _modules(), ids=lambda v: str(v))
def test_no_relative_imports(top: str, path: Path) -> None:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import (use dualpath.…)"


def test_rules_cover_every_package() -> None:
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages - {"cli"} <= set(ALLOWED), packages - set(ALLOWED)
    sim_packages = {p.name for p in (SRC / "sim").iterdir() if (p / "__init__.py").exists()}
    assert sim_packages == {"harness"}, sim_packages  # a new sim subpackage needs its own rule


def _imports_anywhere(path: Path) -> list[tuple[int, str]]:
    """Every absolute import in the module (top level, function bodies, ``try`` blocks)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


@pytest.mark.parametrize(
    "top,path", [m for m in _modules() if m[0] not in ("runtime", "integrations")], ids=lambda v: str(v)
)
def test_serve_extra_only_under_runtime(top: str, path: Path) -> None:
    """A base install (no serve extra) can import every module outside runtime/, whenever it
    runs: no serve library anywhere in it, lazy imports included; bench/ may use httpx only."""
    for lineno, name in _imports_anywhere(path):
        root = name.split(".")[0]
        assert root not in SERVE_EXTRA, (
            f"{path}:{lineno}: {top or 'dualpath'}/ imports {name} (serve extra: only runtime/ may)"
        )
        if root in sys.stdlib_module_names or root == "dualpath":
            continue
        allowed = BASE | (OPTIONAL_ELSEWHERE if path.name == "tables.py" and top == "cost" else set())
        assert root in allowed, f"{path}:{lineno}: imports {name}, which no base install has"
        if top == "bench":
            assert root in {"numpy", "httpx", "matplotlib", "rich", "msgspec"}, f"{path}: {name}"


def _requirement_names(reqs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in reqs}


def test_serve_extra_matches_pyproject() -> None:
    """The names above are the serve extra's and the base install's packages (import names), so
    the check stays honest when pyproject.toml changes."""
    project = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())["project"]
    import_name = {"pyzmq": "zmq", "prometheus-client": "prometheus_client"}
    serve = {import_name.get(n, n) for n in _requirement_names(project["optional-dependencies"]["serve"])}
    assert serve == SERVE_EXTRA - {"starlette"}, serve ^ (SERVE_EXTRA - {"starlette"})
    assert _requirement_names(project["dependencies"]) == BASE


@pytest.mark.parametrize("top,path", _modules(), ids=lambda v: str(v))
def test_vllm_only_under_integrations_vllm(top: str, path: Path) -> None:
    """vLLM (the ``dualpath[vllm]`` extra, a second venv) is imported only by the connector's
    modules under integrations/vllm/, never by the package's ``__init__`` there."""
    rel = path.relative_to(SRC).parts
    may = rel[:2] == ("integrations", "vllm") and rel[-1] != "__init__.py"
    for lineno, name in _imports_anywhere(path):
        if name.split(".")[0] == "vllm":
            assert may, f"{path}:{lineno}: imports {name} (only integrations/vllm/ modules may)"


def test_base_import_does_not_import_vllm() -> None:
    import subprocess

    code = (
        "import sys, dualpath, dualpath.integrations.vllm, dualpath.integrations.vllm.plan, "
        "dualpath.integrations.vllm.settings; sys.exit('vllm' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# ---- no import circles in the house (issue 28, step 1's rule for the whole tree) -----------------
# Today's circles, each removed by the issue 28 step named beside it. The rule: every circle in the
# tree lies inside one of these (a circle that grows, or a new one, fails); an entry no longer a
# circle at all fails too, so the list only shrinks (delete the entry when its step lands).
ALLOWED_CIRCLES: tuple[tuple[str, frozenset[str]], ...] = (
    # step 1: the scheduler service of owned parts (RequestTable, EngineTable; no mixins, no
    # back-pointers, no TYPE_CHECKING import of a module that imports you)
    (
        "step 1: scheduler service",
        frozenset(
            "runtime.cluster." + m
            for m in (
                "health_view",
                "sched_core",
                "sched_engines",
                "sched_guard",
                "sched_info",
                "sched_persist",
                "sched_registry",
                "sched_requests",
                "scheduler",
                "supervisor_view",
            )
        ),
    ),
    # step 1's rule over the rest of runtime/: the supervisor and its judge, the remote PE and the
    # prefill worker, the engine's main loop and its heartbeat (the store's circle went with the
    # storage backends: space.py and posix_backend.py import files.py directly)
    ("step 1: supervisor", frozenset({"runtime.cluster.supervisor", "runtime.cluster.supervisor_judge"})),
    ("step 1: remote PE", frozenset({"runtime.cluster.pe_remote", "runtime.cluster.prefill_worker"})),
    (
        "step 1: engine process",
        frozenset(
            {"runtime.cluster.engine_beat", "runtime.cluster.engine_main", "runtime.cluster.engine_run"}
        ),
    ),
    # step 3: one implementation per decision in policy/ (the scheduler names its kernels; fetch.py
    # imports the package that re-exports it)
    ("step 3: policy fetch", frozenset({"policy", "policy.fetch"})),
    # step 4: smaller (the planner's run and search cut into named steps, their back-imports gone)
    ("step 4: planner search", frozenset({"planner.search", "planner.sigma_partner"})),
    ("step 4: planner run", frozenset({"planner.invariants", "planner.run"})),
)


def _module_name(path: Path) -> str:
    """``dualpath.a.b`` of ``src/dualpath/a/b.py`` (a package is its ``__init__``), less ``dualpath.``."""
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the house modules it imports anywhere: top level, function bodies, ``try`` and
    ``TYPE_CHECKING`` blocks (``from a import b`` names ``a`` and, when it is a module, ``a.b``)."""
    paths = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in paths}
    for module, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for name in names:
                if name.startswith("dualpath."):
                    target = name.removeprefix("dualpath.")
                    if target in graph and target != module:
                        graph[module].add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(frozenset(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


def test_circle_finder_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert sorted(map(sorted, _circles(graph))) == [["a", "b", "c"], ["d", "e"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_in_the_house() -> None:
    """No module imports, however lazily (a function body, ``TYPE_CHECKING``), a module that
    imports it back, directly or round a longer loop; a package ``__init__`` that re-exports its
    submodules is fine while no submodule imports the package. Today's exceptions: ALLOWED_CIRCLES."""
    for circle in _circles(_import_graph()):
        allowed = [why for why, members in ALLOWED_CIRCLES if circle <= members]
        assert allowed, f"import circle: {sorted(circle)} (break it; see ALLOWED_CIRCLES for the rule)"


def test_allowed_circles_still_exist() -> None:
    """An ALLOWED_CIRCLES entry whose circle is gone is deleted, so the list only shrinks."""
    circles = _circles(_import_graph())
    for why, members in ALLOWED_CIRCLES:
        assert any(c <= members for c in circles), f"no circle left in {why!r}: delete its entry"

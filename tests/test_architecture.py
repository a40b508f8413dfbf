"""Keeps the dependency rules of docs/architecture (shared/docs/architecture.md) true.

policy/cost/analysis import only core and spec; spec/core import nothing of ours beyond core;
no heavy runtime library (torch, fastapi, zmq, uvicorn, asyncio servers) outside runtime/ and bench/;
nothing imports the CLI; the serve extra's libraries (pyproject ``serve``) only under runtime/, so the
base install runs every other command; bench/ may use httpx (a base dependency) and nothing heavier.
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

# package -> dualpath subpackages it may import (besides itself)
ALLOWED = {
    "core": set(),
    "spec": {"core"},
    "policy": {"core", "spec"},
    "cost": {"core", "spec"},
    "analysis": {"core", "spec"},
    "workload": {"core", "spec"},
    "sim": {"core", "spec", "policy", "cost", "workload", "analysis"},
    "planner": {"core", "spec", "cost", "sim", "analysis", "workload"},
    "runtime": {"core", "spec", "policy", "cost", "workload", "analysis"},
    "bench": {"core", "spec", "workload", "analysis"},
    # engine integrations (vLLM connector) reuse the runtime's store; only they may import vllm
    "integrations": {"core", "spec", "policy", "cost", "workload", "analysis", "runtime"},
}
LIGHT = {"core", "spec", "policy", "cost", "analysis", "workload", "sim", "planner"}
# pyproject's serve extra, by import name (pyzmq -> zmq, prometheus-client -> prometheus_client)
SERVE_EXTRA = {"torch", "transformers", "fastapi", "uvicorn", "starlette", "zmq",
               "prometheus_client", "safetensors", "gguf", "tokenizers", "isal"}
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


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        top = rel.parts[0] if len(rel.parts) > 1 else ""
        out.append((top, path))
    return out


@pytest.mark.parametrize("top,path", _modules(), ids=lambda v: str(v))
def test_dependency_rules(top: str, path: Path) -> None:
    for name in _imports(path):
        parts = name.split(".")
        if parts[0] == "dualpath" and len(parts) > 1:
            assert parts[1] != "cli" or top == "cli", f"{path} imports the CLI ({name})"
            if top in ALLOWED and parts[1] != top:
                assert parts[1] in ALLOWED[top], f"{path}: {top}/ may not import dualpath.{parts[1]}"
        if top in LIGHT:
            assert parts[0] not in HEAVY, f"{path}: {top}/ may not import {parts[0]}"


def test_rules_cover_every_package() -> None:
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages - {"cli"} <= set(ALLOWED), packages - set(ALLOWED)


def _imports_anywhere(path: Path) -> list[tuple[int, str]]:
    """Every absolute import in the module (top level, function bodies, ``try`` blocks)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


@pytest.mark.parametrize("top,path", [m for m in _modules() if m[0] not in ("runtime", "integrations")],
                         ids=lambda v: str(v))
def test_serve_extra_only_under_runtime(top: str, path: Path) -> None:
    """A base install (no serve extra) can import every module outside runtime/, whenever it
    runs: no serve library anywhere in it, lazy imports included; bench/ may use httpx only."""
    for lineno, name in _imports_anywhere(path):
        root = name.split(".")[0]
        assert root not in SERVE_EXTRA, f"{path}:{lineno}: {top or 'dualpath'}/ imports {name} " \
                                        "(serve extra: only runtime/ may)"
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
    serve = {import_name.get(n, n)
             for n in _requirement_names(project["optional-dependencies"]["serve"])}
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

    code = ("import sys, dualpath, dualpath.integrations.vllm, dualpath.integrations.vllm.plan, "
            "dualpath.integrations.vllm.settings; sys.exit('vllm' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0

"""Keeps the dependency rules of docs/architecture (shared/docs/architecture.md) true.

policy/cost/analysis import only core and spec; spec/core import nothing of ours beyond core;
no heavy runtime library (torch, fastapi, zmq, uvicorn, asyncio servers) outside runtime/ and bench/;
nothing imports the CLI.
"""

from __future__ import annotations

import ast
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
}
LIGHT = {"core", "spec", "policy", "cost", "analysis", "workload", "sim", "planner"}


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

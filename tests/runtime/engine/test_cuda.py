"""The same exactness check on a GPU (side-stream loads, device staging and paged cache)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dualpath.runtime.engine.check import PATHS, CheckConfig, run_check
from dualpath.runtime.model.tiny import TinySpec, make_tiny_checkpoint


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tiny_model_all_paths_on_cuda(tmp_path: Path) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    folder = make_tiny_checkpoint(tmp_path / "m", TinySpec(seed=4))
    report = run_check(CheckConfig(model=str(folder), turns=3, gen_len=4, device="cuda", paths=PATHS))
    assert report["tokens_equal"] and report["max_abs_logit_diff"] < 1e-4

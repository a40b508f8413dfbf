"""``dualpath check`` on a tiny checkpoint folder (no tokenizer: random-token conversation)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dualpath.cli import app
from dualpath.runtime.model.tiny import TinySpec, make_tiny_checkpoint


def test_check_json_ok_and_failing_tolerance_exits_nonzero(tmp_path: Path) -> None:
    folder = make_tiny_checkpoint(tmp_path / "m", TinySpec(num_layers=2, seed=3))
    runner = CliRunner()
    args = [
        "check",
        "--model",
        str(folder),
        "--turns",
        "2",
        "--gen-len",
        "3",
        "--device",
        "cpu",
        "--paths",
        "de,mixed",
        "--json",
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["tokens_equal"] is True and report["max_abs_logit_diff"] < 1e-4
    assert report["paths"] == ["de", "mixed"] and report["hit_tokens"] > 0
    assert {r["read_side"] for r in report["per_turn"]} == {"pe", "de"}
    res = runner.invoke(
        app, [*args[:3], "--turns", "1", "--device", "cpu", "--tolerance", "0", "--paths", "pe", "--json"]
    )
    assert res.exit_code == 1
    assert json.loads(res.stdout)["ok"] is False


def test_tolerance_is_relative_to_the_logits_scale(tmp_path: Path) -> None:
    """A model whose logits are 1e5 times larger (its lm_head scaled): the same float32 rounding,
    1e5 times larger in absolute terms, is the same share of the scale. Before: a fixed absolute
    1e-4 failed it with every token equal (as SmolLM2 at 1.03e-4 on another CPU)."""
    import torch

    from dualpath.runtime.model.tiny import make_tiny_hf_model

    model = make_tiny_hf_model(TinySpec(num_layers=2, seed=3))
    with torch.no_grad():
        model.lm_head.weight.mul_(1e5)
    folder = tmp_path / "loud"
    model.save_pretrained(str(folder), safe_serialization=True)
    args = ["check", "--model", str(folder), "--turns", "1", "--gen-len", "3", "--device", "cpu"]
    res = CliRunner().invoke(app, [*args, "--paths", "pe", "--json"])
    report = json.loads(res.stdout)
    assert report["tokens_equal"] and report["max_abs_logit_diff"] > 1e-4, report
    assert report["max_rel_logit_diff"] <= report["tolerance"] == 1e-5
    assert res.exit_code == 0 and report["ok"]
    text = CliRunner().invoke(app, [*args, "--paths", "pe"]).stdout
    assert "max_abs_logit_diff=" in text and "relative" in text

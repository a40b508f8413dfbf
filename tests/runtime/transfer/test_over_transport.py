"""The real data path over each cross-process transport (``kind``, conftest.py): ``dualpath check
--transport X`` is exact against transformers on a tiny checkpoint (every engine on its own
transport, so the DE-path pulls, the split share and the PE's pushes cross that wire)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dualpath.cli import app
from dualpath.runtime.model.tiny import TinySpec, make_tiny_checkpoint


def test_check_is_exact_over_the_transport(kind: str, tmp_path: Path) -> None:
    folder = make_tiny_checkpoint(tmp_path / "m", TinySpec(num_layers=2, seed=3))
    args = ["check", "--model", str(folder), "--turns", "2", "--gen-len", "3", "--device", "cpu",
            "--paths", "de,split,mixed", "--transport", kind, "--json"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["transport"] == kind and report["ok"] is True
    assert report["tokens_equal"] is True and report["max_abs_logit_diff"] < 1e-4
    assert report["hit_tokens"] > 0 and {r["read_side"] for r in report["per_turn"]} >= {"pe", "de"}


def test_every_engine_moves_its_kv_through_its_own_transport(kind: str, tmp_path: Path) -> None:
    import torch

    from dualpath.runtime.engine.local import GenRequest, LocalConfig, LocalPipeline
    from dualpath.runtime.engine.types import SamplingParams
    from dualpath.runtime.model import load_decoder

    folder = make_tiny_checkpoint(tmp_path / "m", TinySpec(num_layers=2, seed=3))
    dec, _ = load_decoder(str(folder), device="cpu", dtype=torch.float32)
    cfg = LocalConfig(kv_dir=str(tmp_path / "kv"), block_size=16, transport=kind)
    with LocalPipeline(dec, cfg) as pipe:
        assert len({id(t) for t in pipe.transports}) == 2  # the PE's and the DE's
        prompt = tuple(range(3, 70))
        sp = SamplingParams(max_tokens=2)
        pipe.generate([GenRequest(request_id="a", token_ids=prompt, read_side="pe", sampling=sp)])
        out = pipe.generate(
            [GenRequest(request_id="b", token_ids=prompt + (5, 6), read_side="de", sampling=sp)]
        )
        assert out["b"].hit_tokens == 64
        assert pipe.transports[0].poll() > 0 and pipe.transports[1].poll() > 0  # PE -> DE and DE -> PE

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from dualpath.runtime.engine import Generation, GenRequest, LocalPipeline, SamplingParams
from dualpath.runtime.model import Decoder, build_hf_model, load_decoder
from dualpath.runtime.model.tiny import TinySpec, make_tiny_checkpoint

torch.set_num_threads(1)
TOL = 1e-4


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Decoder, Any]:
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("llama"), TinySpec(seed=7))
    dec, ckpt = load_decoder(str(path), device="cpu")
    return dec, build_hf_model(ckpt)


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory: pytest.TempPathFactory) -> tuple[Decoder, Any]:
    spec = TinySpec(family="qwen2", tie_word_embeddings=True, num_layers=2, seed=8)
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("qwen"), spec)
    dec, ckpt = load_decoder(str(path), device="cpu")
    return dec, build_hf_model(ckpt)


def random_tokens(gen: torch.Generator, n: int, vocab: int = 256) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=gen).tolist()


def check_against_hf(hf: Any, prompt: Sequence[int], out: Generation) -> float:
    """Max |logit diff| of a generation versus one full transformers forward; asserts greedy tokens."""
    full = list(prompt) + list(out.tokens[:-1])
    with torch.no_grad():
        ref = hf(torch.tensor([full])).logits[0, len(prompt) - 1 :]
    ours = torch.stack(out.logits)
    assert ref.argmax(-1).tolist() == list(out.tokens)
    diff = (ref - ours).abs().max().item()
    assert diff < TOL
    return diff


def run_conversation(
    pipe: LocalPipeline,
    hf: Any,
    *,
    prompts: dict[str, list[int]],
    sides: Callable[[str, int], str],
    num_turns: int,
    gen: torch.Generator,
    gen_len: int = 6,
    append_len: int = 11,
    decode_engine: Callable[[str], int] = lambda rid: 0,
) -> list[dict[str, Generation]]:
    """Multi-turn: each turn's prompt = previous context + generated + append; checks every turn."""
    ctx = {k: list(v) for k, v in prompts.items()}
    history = []
    for turn in range(num_turns):
        reqs = [
            GenRequest(request_id=f"{k}-t{turn}", token_ids=tuple(v), read_side=sides(k, turn),  # type: ignore[arg-type]
                       decode_engine=decode_engine(k), sampling=SamplingParams(max_tokens=gen_len))
            for k, v in ctx.items()
        ]  # fmt: skip
        outs = pipe.generate(reqs)
        for k in list(ctx):
            out = outs[f"{k}-t{turn}"]
            check_against_hf(hf, ctx[k], out)
            ctx[k] = ctx[k] + list(out.tokens) + random_tokens(gen, append_len)
        history.append(outs)
    return history


@pytest.fixture()
def kv_dir(tmp_path: Path) -> str:
    return str(tmp_path / "kv")

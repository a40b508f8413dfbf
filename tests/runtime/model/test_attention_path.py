"""The decoder's attention runs on SDPA's fused CPU kernel for every span shape (issue 15).

Under ``sdpa_kernel(FLASH_ATTENTION)`` SDPA raises instead of falling back to the math path, so each
test fails if a call is 3-D, has an unsupported mask or any other shape the fused kernel refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from dualpath.runtime.model import Decoder, Span, build_hf_model, load_decoder

TOL = 1e-4


@pytest.mark.parametrize("name", ["llama", "qwen2-tied"])
def test_every_span_shape_runs_fused_and_matches_transformers(tiny_dirs: dict[str, Path], name: str) -> None:
    dec, ckpt = load_decoder(str(tiny_dirs[name]), device="cpu")
    hf = build_hf_model(ckpt)
    gen = torch.Generator().manual_seed(11)
    a = torch.randint(0, dec.config.vocab_size, (40,), generator=gen).tolist()
    b = torch.randint(0, dec.config.vocab_size, (23,), generator=gen).tolist()
    with torch.no_grad():
        ref_a, ref_b = hf(torch.tensor([a])).logits[0], hf(torch.tensor([b])).logits[0]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
        # one packed batch: a plain causal prefill, new tokens on a cached prefix, one decode token
        caches = _prefill(dec, a[:30]), _prefill(dec, b[:22])
        spans = [Span(0, 30), Span(30, 9), Span(22, 1)]
        ids = a[:30] + a[30:39] + b[22:23]
        h = dec.embed(ids)
        rope = dec.rope(dec.positions(spans))
        for i in range(dec.num_layers):
            h, _ = dec.run_layer(i, h, spans, [None, caches[0][i], caches[1][i]], rope)
        logits = dec.final(h)
    assert (logits[:30] - ref_a[:30]).abs().max().item() < TOL
    assert (logits[30:39] - ref_a[30:39]).abs().max().item() < TOL
    assert (logits[39] - ref_b[22]).abs().max().item() < TOL


def _prefill(dec: Decoder, ids: list[int]) -> list[torch.Tensor]:
    h, out = dec.embed(ids), []
    for i in range(dec.num_layers):
        h, kv = dec.run_layer(i, h, [Span(0, len(ids))], [None])
        out.append(kv)
    return out


def test_prefix_mask_is_additive_and_kept(tiny_dirs: dict[str, Path]) -> None:
    dec, _ = load_decoder(str(tiny_dirs["llama"]), device="cpu")
    m = dec._prefix_mask(3, 2, torch.float32, torch.device("cpu"))
    inf = float("-inf")
    assert torch.equal(m, torch.tensor([[0.0, 0, 0, 0, inf], [0, 0, 0, 0, 0]]))
    assert dec._prefix_mask(3, 2, torch.float32, torch.device("cpu")) is m


@pytest.mark.parametrize("name", ["llama", "qwen2-tied"])
def test_keep_last_computes_every_kv_and_only_the_kept_rows(tiny_dirs: dict[str, Path], name: str) -> None:
    """The last layer with ``keep_last``: the same KV for every token (it is sent to the DE and the
    store), and the hidden state of exactly the flagged spans' last tokens, equal to the full layer's."""
    dec, _ = load_decoder(str(tiny_dirs[name]), device="cpu")
    gen = torch.Generator().manual_seed(5)
    a = torch.randint(0, dec.config.vocab_size, (40,), generator=gen).tolist()
    b = torch.randint(0, dec.config.vocab_size, (23,), generator=gen).tolist()
    last = dec.num_layers - 1
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
        caches = _prefill(dec, a[:30]), _prefill(dec, b[:22])
        spans = [Span(0, 12), Span(30, 9), Span(22, 1)]
        ids = b[:12] + a[30:39] + b[22:23]
        h = dec.embed(ids)
        rope = dec.rope(dec.positions(spans))
        for i in range(last):
            h, _ = dec.run_layer(i, h, spans, [None, caches[0][i], caches[1][i]], rope)
        cached = [None, caches[0][last], caches[1][last]]
        full_h, full_kv = dec.run_layer(last, h, spans, cached, rope)
        for keep, rows in (
            ([True, True, True], [11, 20, 21]),
            ([False, True, False], [20]),
            ([False] * 3, []),
        ):
            got_h, got_kv = dec.run_layer(last, h, spans, cached, rope, keep_last=keep)
            assert torch.equal(got_kv, full_kv)
            assert got_h.shape == (len(rows), dec.config.hidden_size)
            if rows:
                assert (got_h - full_h[rows]).abs().max().item() < 1e-5

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dualpath.runtime.model import Decoder, Span, build_hf_model, load_decoder, rope_inv_freq
from dualpath.runtime.model.config import DecoderConfig

TOL = 1e-4


@pytest.mark.parametrize("name", ["llama", "qwen2-tied", "llama3-rope"])
def test_full_forward_matches_transformers(tiny_dirs: dict[str, Path], name: str) -> None:
    dec, ckpt = load_decoder(str(tiny_dirs[name]), device="cpu")
    hf = build_hf_model(ckpt)
    ids = torch.randint(0, dec.config.vocab_size, (90,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        out = dec.forward_full(ids.tolist())
    assert (ref - out).abs().max().item() < TOL


def _layerwise(dec: Decoder, ids: list[int], cuts: list[int]) -> torch.Tensor:
    """Prefill ``ids`` in chunks at ``cuts``, feeding each chunk the KV of the previous ones."""
    cache: list[torch.Tensor | None] = [None] * dec.num_layers
    logits, start = [], 0
    for end in cuts + [len(ids)]:
        span = Span(start, end - start)
        h = dec.embed(ids[start:end])
        for i in range(dec.num_layers):
            h, kv = dec.run_layer(i, h, [span], [cache[i]])
            cache[i] = kv if cache[i] is None else torch.cat((cache[i], kv))
        logits.append(dec.final(h))
        start = end
    return torch.cat(logits)


def test_chunked_layerwise_with_cache_matches_full(tiny_dirs: dict[str, Path]) -> None:
    dec, ckpt = load_decoder(str(tiny_dirs["llama"]), device="cpu")
    hf = build_hf_model(ckpt)
    ids = torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(4)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
        out = _layerwise(dec, ids, [1, 17, 64, 65])
    assert (ref - out).abs().max().item() < TOL


def test_packed_batch_equals_separate_requests(tiny_dirs: dict[str, Path]) -> None:
    dec, _ = load_decoder(str(tiny_dirs["qwen2-tied"]), device="cpu")
    g = torch.Generator().manual_seed(5)
    a, b = (
        torch.randint(0, 256, (30,), generator=g).tolist(),
        torch.randint(0, 256, (12,), generator=g).tolist(),
    )
    # request a: 20 cached + 10 new; request b: 0 cached + 12 new, packed into one call per layer
    ca = _kv_of(dec, a[:20])
    spans = [Span(20, 10), Span(0, 12)]
    h = dec.embed(a[20:] + b)
    rope = dec.rope(dec.positions(spans))
    for i in range(dec.num_layers):
        h, _ = dec.run_layer(i, h, spans, [ca[i], None], rope)
    packed = dec.final(h)
    assert (packed[:10] - dec.forward_full(a)[20:]).abs().max().item() < TOL
    assert (packed[10:] - dec.forward_full(b)).abs().max().item() < TOL


def _kv_of(dec: Decoder, ids: list[int]) -> list[torch.Tensor]:
    h, out = dec.embed(ids), []
    for i in range(dec.num_layers):
        h, kv = dec.run_layer(i, h, [Span(0, len(ids))], [None])
        out.append(kv)
    return out


def test_llama3_scaling_changes_frequencies(tiny_dirs: dict[str, Path]) -> None:
    dec, _ = load_decoder(str(tiny_dirs["llama3-rope"]), device="cpu")
    cfg = dec.config
    plain = DecoderConfig(**{f: getattr(cfg, f) for f in DecoderConfig.__slots__} | {"rope_type": "default"})
    scaled, base = rope_inv_freq(cfg), rope_inv_freq(plain)
    assert cfg.rope_type == "llama3"
    assert torch.equal(scaled[0], base[0]) and scaled[-1] < base[-1]


def test_bf16_close_to_fp32(tiny_dirs: dict[str, Path]) -> None:
    d32, ckpt = load_decoder(str(tiny_dirs["llama"]), device="cpu")
    d16 = Decoder(ckpt.config, ckpt.weights, dtype=torch.bfloat16)
    ids = list(range(1, 40))
    a, b = d32.forward_full(ids), d16.forward_full(ids).float()
    assert b.dtype == torch.float32 and (a - b).abs().max().item() < 0.25 * a.abs().max().item()
    assert d16.config.kv_bytes_per_token_layer(torch.bfloat16) == 2 * 2 * 16 * 2


def test_cache_with_room_is_filled_in_place_and_matches(tiny_dirs: dict[str, Path]) -> None:
    dec, _ = load_decoder(str(tiny_dirs["llama"]), device="cpu")
    ids = list(range(5, 45))
    cache = _kv_of(dec, ids[:30])
    span = [Span(30, 10)]
    h_ref = h_room = dec.embed(ids[30:])
    for i in range(dec.num_layers):
        room = torch.full((41, 2, 2, 16), float("nan"))
        room[:30] = cache[i]
        h_ref, kv_ref = dec.run_layer(i, h_ref, span, [cache[i]])
        h_room, kv_room = dec.run_layer(i, h_room, span, [room], cache_has_room=True)
        assert torch.equal(kv_ref, kv_room) and torch.equal(room[30:40], kv_room)
        assert torch.isnan(room[40]).all()  # nothing beyond the new tokens is touched
    assert torch.equal(h_ref, h_room)
    with pytest.raises(Exception, match="room for 10 more"):
        dec.run_layer(0, dec.embed(ids[30:]), span, [cache[0]], cache_has_room=True)

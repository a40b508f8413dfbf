"""The paged cache reads a request's context in place when its blocks are one run (issue 15)."""

from __future__ import annotations

from typing import Any

import torch

from dualpath.runtime.engine import (
    GenRequest,
    KVGeometry,
    LocalConfig,
    LocalPipeline,
    PagedKVCache,
    SamplingParams,
)
from dualpath.runtime.model import Decoder

from .conftest import check_against_hf, random_tokens

GEO = KVGeometry(num_layers=3, block_size=8, num_kv_heads=2, head_dim=4, dtype=torch.float32)


def test_allocate_prefers_a_run_and_context_is_a_view_of_the_cache() -> None:
    cache = PagedKVCache(GEO, 8, torch.device("cpu"))
    a, b = cache.allocate(9), cache.allocate(17)
    assert a == [0, 1] and b == [2, 3, 4]
    cache.free(a)
    assert cache.allocate(17) == [5, 6, 7]  # the first run of three free ids, not [0, 1, 5]
    assert cache.allocate(9) == [0, 1]
    assert PagedKVCache.run_start(b) == 2 and PagedKVCache.run_start([0, 2]) is None
    for pos in range(17):
        cache.write_token(1, b, pos, torch.full((2, 2, 4), float(pos)))
    view = cache.context(1, 2, cache.index(b), 17)
    assert view.shape == (17, 2, 2, 4) and torch.equal(view[:, 0, 0, 0], torch.arange(17.0))
    view[16].fill_(-1.0)  # a view: writing it writes the cache
    assert torch.equal(cache.gather(1, cache.index(b), 17)[16], torch.full((2, 2, 4), -1.0))


def test_scattered_blocks_fall_back_to_a_gather_and_blocks_keep_the_full_block_layout() -> None:
    cache = PagedKVCache(GEO, 6, torch.device("cpu"))
    singles = [cache.allocate(1) for _ in range(6)]
    for s in singles[::2]:
        cache.free(s)  # free ids 0, 2, 4: no run of two
    ids = cache.allocate(10)
    assert ids == [0, 2] and PagedKVCache.run_start(ids) is None
    block = torch.arange(GEO.num_layers * 8 * 16, dtype=torch.float32).view(GEO.num_layers, 8, 2, 2, 4)
    cache.write_block(2, block)
    got = cache.context(2, None, cache.index(ids), 10)
    assert torch.equal(got[8:], block[2, :2])
    raw = cache.block_bytes(2)
    assert raw.nbytes == GEO.full_block_bytes and torch.equal(torch.from_numpy(raw.copy()).view(torch.float32),
                                                               block.reshape(-1))  # fmt: skip
    cache.data[:, 2].zero_()
    assert torch.from_numpy(raw).view(torch.float32).abs().sum() > 0  # a copy, not a view


def test_decode_from_a_fragmented_cache_matches_transformers(
    tiny_llama: tuple[Decoder, Any], kv_dir: str
) -> None:
    dec, hf = tiny_llama
    gen = torch.Generator().manual_seed(31)
    prompts = {k: random_tokens(gen, n) for k, n in (("a", 21), ("b", 30))}
    with LocalPipeline(dec, LocalConfig(kv_dir=kv_dir, block_size=8, num_cache_blocks=24)) as pipe:
        cache = pipe.decode[0].cache
        held = [cache.allocate(1) for _ in range(24)]
        for h in held[::2]:
            cache.free(h)  # 12 scattered single blocks free: no request gets a run
        probe = cache.allocate(9)
        assert probe == [0, 2] and PagedKVCache.run_start(probe) is None
        cache.free(probe)
        outs = pipe.generate([GenRequest(request_id=k, token_ids=tuple(p), sampling=SamplingParams(max_tokens=9))
                              for k, p in prompts.items()])  # fmt: skip
        for k, p in prompts.items():
            check_against_hf(hf, p, outs[k])
        for h in held[1::2]:
            cache.free(h)
        outs = pipe.generate([GenRequest(request_id="c", token_ids=tuple(prompts["b"]),
                                         sampling=SamplingParams(max_tokens=9))])  # fmt: skip
        check_against_hf(hf, prompts["b"], outs["c"])

"""Buffers, staging, paged cache and sampling: bounds and byte layout."""

from __future__ import annotations

import pytest
import torch

from dualpath.core.errors import ConfigError
from dualpath.runtime.engine import (
    KVBuffer,
    KVGeometry,
    LayerStaging,
    PagedKVCache,
    SamplingParams,
    sample_token,
)
from dualpath.runtime.engine.types import layer_items_spans
from dualpath.runtime.transfer import FULL_BLOCK, TransferItem

GEO = KVGeometry(num_layers=3, num_kv_heads=2, head_dim=4, dtype=torch.float32, block_size=8)


def test_geometry_matches_store_layout() -> None:
    assert GEO.kv_bytes_per_token_layer == 2 * 2 * 4 * 4
    assert GEO.full_block_bytes == 3 * 8 * 64 == GEO.layout.full_block_bytes
    assert GEO.num_blocks(17) == 3 and GEO.num_blocks(16) == 2
    assert layer_items_spans(5, 21, 8) == [(0, 5, 3), (1, 0, 8), (2, 0, 5)]


def test_buffer_is_bounded_and_all_or_nothing() -> None:
    buf = KVBuffer(GEO, 5 * GEO.full_block_bytes + 7, name="de0")
    assert buf.capacity_bytes == 5 * GEO.full_block_bytes
    assert buf.allocate("a", 24) is not None  # 3 blocks
    assert buf.allocate("b", 17) is None and buf.num_free_blocks == 2  # needs 3: nothing taken
    assert buf.allocate("c", 16) is not None and buf.num_free_blocks == 0
    with pytest.raises(ConfigError, match="already has blocks"):
        buf.allocate("a", 1)
    buf.free("a")
    assert buf.num_free_blocks == 3
    with pytest.raises(ConfigError, match="at least one Full Block"):
        KVBuffer(GEO, GEO.full_block_bytes - 1)


def test_buffer_deliver_layer_and_full_blocks_land_in_layout() -> None:
    buf = KVBuffer(GEO, 4 * GEO.full_block_bytes)
    blocks = buf.allocate("r", 20)
    assert blocks is not None
    kv = torch.arange(12 * 16, dtype=torch.float32).view(12, 2, 2, 4)
    # tokens 5..16 of layer 1, as bytes for the first piece and as a tensor for the second
    pieces = layer_items_spans(5, 17, 8)
    items, src = [], 0
    for b, off, n in pieces:
        part = kv[src : src + n]
        payload = part.numpy().tobytes() if b == 0 else part
        items.append(
            TransferItem(key="r", block_index=b, layer=1, num_tokens=n, token_offset=off, payload=payload)
        )
        src += n
    buf.deliver("pe0", items)
    out = torch.empty(12, 2, 2, 4)
    blocks.read_tokens(1, 5, 17, out)
    assert torch.equal(out, kv)
    # the same bytes sit at layer 1's range of the Full Block byte array (store layout)
    start, _ = GEO.layout.layer_range(1)
    tok = GEO.kv_bytes_per_token_layer
    raw = blocks.arrays[1][start : start + 8 * tok].view("<f4")  # block 1 holds tokens 8..15
    assert torch.equal(torch.from_numpy(raw.copy()).view(8, 2, 2, 4), kv[3:11])
    full = torch.randn(3, 8, 2, 2, 4)
    buf.deliver("x", [TransferItem(key="r", block_index=2, layer=FULL_BLOCK, num_tokens=8, payload=full)])
    assert torch.equal(blocks.tensors[2], full)
    items = buf.layer_items("r", 1, 5, 17)
    assert [(i.block_index, i.token_offset, i.num_tokens) for i in items] == pieces


def test_staging_bounds_one_layer_pair() -> None:
    st = LayerStaging(GEO, 16, torch.device("cpu"))
    assert st.nbytes == 2 * 16 * GEO.kv_bytes_per_token_layer
    st.arrange(0, [("a", 4, 1), ("b", 6, 2)])  # b: 6 cached + 2 new = one block
    st.arrange(1, [("a", 4, 5)])
    assert st.view(0, "b").shape == (6, 2, 2, 4) and st.view(1, "a").shape == (4, 2, 2, 4)
    assert st.padded_view(0, "b").shape == (8, 2, 2, 4)  # requests start on whole blocks
    assert st.work_view(0, "b").shape == (8, 2, 2, 4) and st.work_view(1, "a").shape == (9, 2, 2, 4)
    st.deliver("de0", [TransferItem(key="b", block_index=0, layer=0, num_tokens=2, token_offset=3,
                                    payload=torch.ones(2, 2, 2, 4))])  # fmt: skip
    assert st.view(0, "b")[3:5].sum().item() == 32 and st.view(0, "b")[:3].abs().sum().item() == 0
    with pytest.raises(ConfigError, match="max_cached_tokens"):
        st.arrange(2, [("a", 9, 0), ("b", 1, 0)])  # 16 + 8 padded tokens > 16
    with pytest.raises(ConfigError, match="beyond"):
        st.deliver(
            "de0",
            [TransferItem(key="a", block_index=0, layer=1, num_tokens=5, payload=torch.ones(5, 2, 2, 4))],
        )


def test_paged_cache_alloc_gather_write() -> None:
    cache = PagedKVCache(GEO, 4, torch.device("cpu"))
    ids = cache.allocate(17)
    assert ids is not None and len(ids) == 3 and cache.allocate(9) is None
    table = cache.index(ids)
    for pos in range(17):
        for layer in range(3):
            cache.write_token(layer, ids, pos, torch.full((2, 2, 4), float(pos * 10 + layer)))
    got = cache.gather(2, table, 17)
    assert got.shape == (17, 2, 2, 4) and torch.equal(got[:, 0, 0, 0], torch.arange(17) * 10.0 + 2)
    assert cache.block_bytes(ids[1]).nbytes == GEO.full_block_bytes
    cache.free(ids)
    assert cache.num_free_blocks == 4


def test_sampling_greedy_seeded_and_top_p() -> None:
    logits = torch.tensor([0.0, 3.0, 2.9, -1.0])
    assert sample_token(logits, SamplingParams(), 0) == 1
    hot = SamplingParams(temperature=1.0, seed=5)
    draws = [sample_token(logits, hot, s) for s in range(40)]
    assert draws == [sample_token(logits, hot, s) for s in range(40)]  # reproducible per (seed, step)
    assert {1, 2} <= set(draws)
    nucleus = SamplingParams(temperature=1.0, top_p=0.01, seed=5)
    assert all(sample_token(logits, nucleus, s) == 1 for s in range(20))
    with pytest.raises(ConfigError, match="top_p"):
        SamplingParams(top_p=0.0)

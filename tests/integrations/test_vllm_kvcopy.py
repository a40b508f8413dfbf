"""Gathers and scatters between vLLM's paged layouts and the store's token-major Layer Blocks."""

from __future__ import annotations

import pytest
import torch

from dualpath.core.errors import ConfigError
from dualpath.integrations.vllm.kvcopy import PagedLayer

N, H, D = 4, 3, 2  # block size, kv heads, head dim


def _cpu_cache(num_blocks: int) -> torch.Tensor:
    """vLLM-CPU's cache, filled so that each element names (block, kv, head, token, dim)."""
    raw = torch.zeros(num_blocks, H, 2, N, D)
    for b in range(num_blocks):
        for kv in range(2):
            for h in range(H):
                for t in range(N):
                    raw[b, h, kv, t] = torch.tensor([b * 1000 + kv * 100 + h * 10 + t] * D)
    return raw.view(num_blocks, H, N, 2 * D)  # the shape vLLM-CPU allocates


def test_cpu_gather_is_token_major_k_then_v() -> None:
    layer = PagedLayer.of(_cpu_cache(5), block_size=N, num_kv_heads=H, head_dim=D)
    assert layer.kind == "cpu"
    out = layer.gather([3, 1])
    assert out.shape == (2 * N, 2, H, D)
    # token 1 of block 1 (row N + 1), V (1), head 2 -> 1000 + 100 + 20 + 1
    assert out[N + 1, 1, 2, 0].item() == 1121
    assert out[2, 0, 1, 1].item() == 3012  # token 2 of block 3, K, head 1


@pytest.mark.parametrize("kind", ["cpu", "flash"])
def test_scatter_inverts_gather(kind: str) -> None:
    cache = torch.randn(6, H, N, 2 * D) if kind == "cpu" else torch.randn(2, 6, N, H, D)
    layer = PagedLayer.of(cache, block_size=N, num_kv_heads=H, head_dim=D)
    assert layer.kind == kind
    data = layer.gather([0, 4])
    before = cache.clone()
    layer.scatter([2, 5], data)
    assert torch.equal(layer.gather([2, 5]), data)
    untouched = [0, 1, 3, 4]
    pick = (lambda c: c[untouched]) if kind == "cpu" else (lambda c: c[:, untouched])
    assert torch.equal(pick(cache), pick(before))


def test_unknown_layout_is_named() -> None:
    with pytest.raises(ConfigError, match=r"\(6, 7\)"):
        PagedLayer.of(torch.zeros(6, 7), block_size=N, num_kv_heads=H, head_dim=D)


@pytest.mark.parametrize("kind", ["cpu", "flash"])
def test_gather_into_a_staging_row_equals_gather(kind: str) -> None:
    """Four vLLM blocks (two store blocks of two each) gathered into the layer-1 row of a
    layer-major staging buffer (layers 0..2): the same bytes as ``gather``, in block order, the
    other layers' rows untouched; a strided ``out`` is refused."""
    cache = torch.randn(6, H, N, 2 * D) if kind == "cpu" else torch.randn(2, 6, N, H, D)
    layer = PagedLayer.of(cache, block_size=N, num_kv_heads=H, head_dim=D)
    per_block = N * 2 * H * D  # floats of one vLLM block
    ids = [4, 0, 2, 5]
    stage = torch.zeros(3, len(ids) * per_block)
    layer.gather_into(torch.tensor(ids), stage[1])
    assert torch.equal(stage[1], layer.gather(ids).reshape(-1))
    assert not stage[0].any() and not stage[2].any()
    layer.gather_into(ids[:2], stage[2, : 2 * per_block])  # (a list of ids too)
    assert torch.equal(stage[2, : 2 * per_block], stage[1, : 2 * per_block])
    with pytest.raises(ConfigError, match="contiguous"):
        layer.gather_into(ids, stage[:, :per_block].t())

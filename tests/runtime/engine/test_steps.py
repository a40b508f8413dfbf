"""The engines driven step by step, as the multi-process wrapper drives them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from dualpath.core.errors import ConfigError
from dualpath.policy.views import BatchEntry
from dualpath.runtime.engine import (
    DecodeConfig,
    DecodeEngine,
    GenRequest,
    LocalConfig,
    LocalPipeline,
    PrefillConfig,
    PrefillEngine,
    PrefillRequest,
    SamplingParams,
)  # fmt: skip
from dualpath.runtime.kvstore import BlockStore, IOEngine, chain_hashes
from dualpath.runtime.model import Decoder
from dualpath.runtime.transfer import InProcFabric

from .conftest import random_tokens


def _engines(
    dec: Decoder, kv_dir: Path, bs: int = 8, cache_blocks: int = 64
) -> tuple[PrefillEngine, DecodeEngine, IOEngine]:
    from dualpath.runtime.engine import KVGeometry

    store = BlockStore(kv_dir, KVGeometry.of(dec.config, dec.dtype, bs).layout)
    io = IOEngine(store)
    tx = InProcFabric().transport()
    de = DecodeEngine(
        dec, tx, io, DecodeConfig(block_size=bs, buffer_bytes=1 << 20, num_cache_blocks=cache_blocks)
    )
    pe = PrefillEngine(dec, tx, io, PrefillConfig(block_size=bs, buffer_bytes=1 << 20, max_cached_tokens=256),
                       remotes={"de0": de})  # fmt: skip
    return pe, de, io


def test_single_token_chunks_deliver_exact_kv_to_the_de_buffer(
    tiny_llama: tuple[Decoder, Any], tmp_path: Path
) -> None:
    """Chunks of 1, 5 and the rest; the DE buffer then holds exactly transformers' past_key_values."""
    dec, hf = tiny_llama
    pe, de, io = _engines(dec, tmp_path)
    ids = random_tokens(torch.Generator().manual_seed(20), 29)
    assert de.reserve("r", len(ids))
    assert pe.add_request(PrefillRequest(request_id="r", token_ids=tuple(ids), decode_endpoint="de0"))
    (item,) = pe.waiting()
    assert (item.cached_len, item.new_len) == (0, 29)
    assert pe.step([BatchEntry(request_id="r", cached_len=0, chunk_len=1)]) == []
    with pytest.raises(ConfigError, match="cached_len"):
        pe.step([BatchEntry(request_id="r", cached_len=0, chunk_len=1)])
    with pytest.raises(ConfigError, match="chunk_len"):
        pe.step([BatchEntry(request_id="r", cached_len=1, chunk_len=29)])
    pe.step([BatchEntry(request_id="r", cached_len=1, chunk_len=5)])
    (out,) = pe.step([BatchEntry(request_id="r", cached_len=6, chunk_len=23)])
    with torch.no_grad():
        ref = hf(torch.tensor([ids]), use_cache=True)
    assert out.first_token == int(ref.logits[0, -1].argmax())
    assert (out.logits - ref.logits[0, -1]).abs().max().item() < 1e-4
    blocks = de.buffer.blocks("r")
    got = torch.empty(29, 2, 2, 16)
    for layer in range(dec.num_layers):
        blocks.read_tokens(layer, 0, 29, got)
        k_ref, v_ref = ref.past_key_values.layers[layer].keys[0], ref.past_key_values.layers[layer].values[0]
        assert (got[:, 0].transpose(0, 1) - k_ref).abs().max().item() < 1e-4
        assert (got[:, 1].transpose(0, 1) - v_ref).abs().max().item() < 1e-4
    pe.close()
    io.close()


def test_decode_persists_every_full_block_and_admission_is_bounded(
    tiny_llama: tuple[Decoder, Any], tmp_path: Path
) -> None:
    dec, _ = tiny_llama
    ids = tuple(random_tokens(torch.Generator().manual_seed(21), 21))
    with LocalPipeline(dec, LocalConfig(kv_dir=str(tmp_path), block_size=8, num_cache_blocks=6)) as pipe:
        out = pipe.generate([GenRequest(request_id="r", token_ids=ids,
                                        sampling=SamplingParams(max_tokens=20))])["r"]  # fmt: skip
        assert len(out.tokens) == 20
        context = list(ids) + list(out.tokens[:-1])  # 40 tokens have KV: 5 full blocks
        assert all(pipe.store.contains(h) for h in chain_hashes(context, 8))
        assert pipe.store.stats().num_blocks == 5
        with pytest.raises(ConfigError, match="num_cache_blocks"):  # 21 + 40 tokens need 8 > 6 blocks
            pipe.generate([GenRequest(request_id="s", token_ids=ids, sampling=SamplingParams(max_tokens=40))])


def test_stop_token_and_sampled_decode_are_reproducible(
    tiny_llama: tuple[Decoder, Any], tmp_path: Path
) -> None:
    dec, _ = tiny_llama
    ids = tuple(random_tokens(torch.Generator().manual_seed(22), 12))
    hot = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=10)
    runs = []
    for i in range(2):
        with LocalPipeline(dec, LocalConfig(kv_dir=str(tmp_path / f"kv{i}"), block_size=8)) as pipe:
            runs.append(
                pipe.generate([GenRequest(request_id="r", token_ids=ids, sampling=hot, read_side="de")])[
                    "r"
                ].tokens
            )
    assert runs[0] == runs[1] and len(runs[0]) == 10
    with LocalPipeline(dec, LocalConfig(kv_dir=str(tmp_path / "kv2"), block_size=8)) as pipe:
        greedy_first = pipe.generate([GenRequest(request_id="g", token_ids=ids)])["g"].tokens[0]
        stop = SamplingParams(max_tokens=10, stop_token_ids=(greedy_first,))
        out = pipe.generate([GenRequest(request_id="s", token_ids=ids, sampling=stop)])["s"]
    assert out.tokens == (greedy_first,)


def test_de_path_without_connection_and_full_buffer_refused(
    tiny_llama: tuple[Decoder, Any], tmp_path: Path
) -> None:
    dec, _ = tiny_llama
    tx = InProcFabric().transport()
    pe = PrefillEngine(dec, tx, None, PrefillConfig(block_size=8, buffer_bytes=2 * 3 * 8 * 256))
    hashes = ("0" * 32,)
    with pytest.raises(ConfigError, match="not connected"):
        pe.add_request(PrefillRequest(request_id="r", token_ids=tuple(range(20)), decode_endpoint="deX",
                                      read_side="de", hit_hashes=hashes))  # fmt: skip
    assert not pe.add_request(
        PrefillRequest(request_id="big", token_ids=tuple(range(40)), decode_endpoint="d")
    )
    assert pe.num_requests == 0
    pe.close()

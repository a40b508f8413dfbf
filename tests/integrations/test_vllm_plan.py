"""The vLLM connector's scheduler bookkeeping, block-size rules and paged-cache copies (no vLLM)."""

from __future__ import annotations

import pytest

from dualpath.core.errors import ConfigError
from dualpath.integrations.vllm.plan import BlockSizes, RequestTracker
from dualpath.integrations.vllm.settings import ConnectorSettings, layer_index, saves_in_step
from dualpath.runtime.kvstore.layout import chain_hashes


def _tracker(vllm: int = 4, store: int = 8) -> RequestTracker:
    return RequestTracker(BlockSizes(vllm_block_size=vllm, store_block_size=store))


def test_store_block_must_be_a_multiple_of_vllms() -> None:
    assert BlockSizes(vllm_block_size=32, store_block_size=64).ratio == 2
    with pytest.raises(ConfigError, match="multiple"):
        BlockSizes(vllm_block_size=32, store_block_size=48)
    with pytest.raises(ConfigError, match="multiple"):
        ConnectorSettings.from_extra({"store_dir": "/x", "block_size": 16}, vllm_block_size=32)


def test_settings_reject_unknown_keys_and_missing_dir() -> None:
    with pytest.raises(ConfigError, match="unknown"):
        ConnectorSettings.from_extra({"store_dir": "/x", "shared_storage_path": "/y"}, vllm_block_size=16)
    with pytest.raises(ConfigError, match="store_dir"):
        ConnectorSettings.from_extra({}, vllm_block_size=16)
    s = ConnectorSettings.from_extra({"store_dir": "/x"}, vllm_block_size=16)
    assert s.block_size == 16 and s.verify


def test_layer_index_reads_the_last_number() -> None:
    assert layer_index("model.layers.17.self_attn.attn") == 17
    with pytest.raises(ConfigError):
        layer_index("lm_head")


def test_hashes_match_the_store_index() -> None:
    """The connector hashes exactly as the block store (and ``dualpath serve``) does."""
    t = _tracker()
    tokens = list(range(100, 131))
    assert t.hashes_for(tokens) == chain_hashes(tokens, 8)


def test_prefill_then_decode_saves_each_block_once_as_it_fills() -> None:
    t = _tracker(vllm=4, store=8)
    tokens = list(range(20))
    t.admit("r", lambda: tokens)
    t.set_hit("r", [])
    t.plan_load("r", [5, 6, 7, 8, 9], 0, 0)
    load, save = t.step_specs("r", 20)  # prefill of 20 tokens: blocks 0 and 1 are whole
    assert load is None and save is not None
    assert save.block_indices == (0, 1) and save.parents[0] is None
    assert save.parents[1] == save.hashes[0] and save.token_ids[1] == tuple(range(8, 16))
    assert save.vllm_block_ids == (5, 6, 7, 8, 9)
    for n in range(21, 24):  # decode: block 2 (tokens 16..23) is not whole yet
        tokens.append(n)
        assert t.step_specs("r", n) == (None, None)
    tokens.append(24)
    t.set_blocks("r", [10], replace=False)
    _, save = t.step_specs("r", 24)
    assert save is not None and save.block_indices == (2,) and save.vllm_block_ids[-1] == 10
    assert save.hashes == (chain_hashes(tokens, 8)[2],)


def test_a_hit_is_loaded_once_and_never_saved_again() -> None:
    t = _tracker(vllm=4, store=8)
    tokens = list(range(30))
    hit = chain_hashes(tokens, 8)[:3]  # 24 tokens in the store
    t.admit("r", lambda: tokens)
    t.set_hit("r", hit)
    # vLLM's own prefix cache had the first 8 tokens: load 16 external tokens
    t.plan_load("r", list(range(40, 48)), 16, 24)
    load, save = t.step_specs("r", 30)
    assert load is not None and (load.start_token, load.end_token) == (8, 24)
    assert load.first_block == 1 and load.hashes == tuple(hit[1:3])
    assert save is None  # blocks 0..2 are in the store; block 3 is not whole at 30 tokens
    assert t.step_specs("r", 31) == (None, None)  # the load happens once


def test_saves_wait_for_vllm_blocks() -> None:
    """A store block is saved only once every vLLM block under it is allocated."""
    t = _tracker(vllm=4, store=8)
    tokens = list(range(16))
    t.admit("r", lambda: tokens)
    t.plan_load("r", [1, 2, 3], 0, 0)
    _, save = t.step_specs("r", 16)
    assert save is not None and save.block_indices == (0,)


def test_blocks_sent_to_the_writer_count_as_hits_until_found_on_disk() -> None:
    """A request's blocks saved after their step (the writer thread) are a hit for this instance's
    next turn even before they are on disk; blocks of a P/D request (written in the step) are not
    remembered; blocks found on disk are forgotten."""
    t = _tracker(vllm=4, store=8)
    tokens = list(range(30))
    t.admit("a", lambda: tokens)
    t.plan_load("a", list(range(8)), 0, 0)
    _, save = t.step_specs("a", 30)
    assert save is not None and not save.in_step and save.block_indices == (0, 1, 2)
    hashes = chain_hashes(tokens, 8)
    on_disk: set[str] = set()
    assert t.extend_hit(tokens[:24], [], on_disk.__contains__) == hashes[:3]
    assert t.extend_hit(tokens[:16] + [99] * 8, [], on_disk.__contains__) == hashes[:2]  # chain ends
    other = list(range(500, 530))  # another chain: nothing promised, a block on disk is a hit
    on_disk.add(chain_hashes(other, 8)[0])
    assert t.extend_hit(other[:24], [], on_disk.__contains__) == chain_hashes(other, 8)[:1]
    assert t.extend_hit(tokens[:24], hashes[:3], on_disk.__contains__) == hashes[:3]  # found: forgotten
    assert t.extend_hit(tokens[:24], [], on_disk.__contains__) == []
    t.admit("pd", lambda: other, saves_in_step=True)
    t.plan_load("pd", list(range(8, 16)), 0, 0)
    _, save = t.step_specs("pd", 30)
    assert save is not None and save.in_step
    on_disk.clear()
    assert t.extend_hit(other[:24], [], on_disk.__contains__) == []


def test_p_d_requests_save_in_step() -> None:
    assert not saves_in_step(None) and not saves_in_step({}) and not saves_in_step({"dualpath": "x"})
    assert saves_in_step({"dualpath": {"read_side": "pe"}})  # the proxy's prefill request
    assert saves_in_step({"dualpath": {"stored_tokens": 64}})  # the decode request it sends on
    assert saves_in_step({"do_remote_decode": True})

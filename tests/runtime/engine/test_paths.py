"""Engine output equals a full transformers forward over multi-turn conversations, on every path."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dualpath.runtime.engine import LocalConfig, LocalPipeline
from dualpath.runtime.model import Decoder

from .conftest import random_tokens, run_conversation


@pytest.mark.parametrize(
    ("side", "overlap"),
    [("pe", True), ("de", True), ("split", True), ("pe", False), ("de", False), ("split", False)],
)
def test_single_path_multi_turn(
    tiny_llama: tuple[Decoder, Any], kv_dir: str, side: str, overlap: bool
) -> None:
    dec, hf = tiny_llama
    gen = torch.Generator().manual_seed(11)
    cfg = LocalConfig(kv_dir=kv_dir, block_size=16, max_batch_tokens=4096, overlap=overlap)
    with LocalPipeline(dec, cfg) as pipe:
        hist = run_conversation(pipe, hf, prompts={"a": random_tokens(gen, 45)},
                                sides=lambda k, t: side, num_turns=3, gen=gen)  # fmt: skip
    hits = [h["a-t" + str(t)].hit_tokens for t, h in enumerate(hist)]
    # turn 0 misses; later turns hit every whole block of the previous context with KV (45+5, 50+6+11+5)
    assert hits == [0, 48, 64]
    # split: 3 hit blocks -> PE 2 (half up) + DE 1; 4 -> 2 + 2 (the policy's split of two idle queues)
    assert [h["a-t" + str(t)].read_side for t, h in enumerate(hist)] == [
        side if side != "split" else "pe",
        side,
        side,
    ]


@pytest.mark.parametrize("async_transfer", [False, True])
def test_split_reads_both_sides_and_a_de_miss_cuts_its_share(
    tiny_llama: tuple[Decoder, Any], kv_dir: str, async_transfer: bool
) -> None:
    """Split: the PE reads the first hit blocks, the DE reads the rest and pushes every layer of
    them into the PE buffer; a block missing from the DE's share cuts the hits there (recomputed),
    and the outputs stay exact."""
    from dualpath.runtime.kvstore import chain_hashes
    from dualpath.runtime.kvstore.files import block_path

    dec, hf = tiny_llama
    gen = torch.Generator().manual_seed(15)
    cfg = LocalConfig(kv_dir=kv_dir, block_size=16, async_transfer=async_transfer)
    prompt = random_tokens(gen, 70)
    with LocalPipeline(dec, cfg) as pipe:
        first = run_conversation(pipe, hf, prompts={"a": prompt}, gen=gen, num_turns=1,
                                 sides=lambda k, t: "split")[0]["a-t0"]  # fmt: skip
        context = prompt + list(first.tokens)
        follow = context + random_tokens(gen, 9)
        out = run_conversation(pipe, hf, prompts={"a": follow}, gen=gen, num_turns=1,
                               sides=lambda k, t: "split")[0]["a-t0"]  # fmt: skip
        assert out.read_side == "split" and out.hit_tokens == 64  # 4 blocks: PE 2 + DE 2
        hashes = chain_hashes(follow[:80], 16)  # the same prompt again now hits 5 blocks: PE 3 + DE 2
        block_path(pipe.store.root, hashes[4]).unlink()  # the DE's second block goes missing
        again = run_conversation(pipe, hf, prompts={"a": follow}, gen=gen, num_turns=1,
                                 sides=lambda k, t: "split")[0]["a-t0"]  # fmt: skip
        assert again.read_side == "split" and again.hit_tokens == 64  # PE 3 + the DE's first


@pytest.mark.parametrize("side", ["pe", "split", "de"])
def test_the_pe_forwards_only_the_kv_its_de_does_not_hold(
    tiny_llama: tuple[Decoder, Any], kv_dir: str, side: str
) -> None:
    """PD transfer per layer: PE path, the whole prompt (hits from the PE buffer, once); split, all
    but the DE's share (the DE read that into its own buffer); DE path, only the computed tokens.
    The outputs stay exact (run_conversation compares them with transformers)."""
    dec, hf = tiny_llama
    gen = torch.Generator().manual_seed(21)
    cfg = LocalConfig(kv_dir=kv_dir, block_size=16)
    prompt = random_tokens(gen, 70)
    with LocalPipeline(dec, cfg) as pipe:
        first = run_conversation(pipe, hf, prompts={"a": prompt}, gen=gen, num_turns=1,
                                 sides=lambda k, t: "pe")[0]["a-t0"]  # fmt: skip
        follow = prompt + list(first.tokens) + random_tokens(gen, 9)
        sent: dict[int, int] = {}  # layer -> tokens the PE sent to a DE
        submit = pipe.transport.submit

        def counting(dest: str, items: Any, *args: Any, **kw: Any) -> Any:
            if kw.get("source") == "pe0" and not dest.endswith(".buffer"):
                for it in items:
                    sent[it.layer] = sent.get(it.layer, 0) + it.num_tokens
            return submit(dest, items, *args, **kw)

        pipe.transport.submit = counting  # type: ignore[method-assign]
        out = run_conversation(pipe, hf, prompts={"a": follow}, gen=gen, num_turns=1,
                               sides=lambda k, t: side)[0]["a-t0"]  # fmt: skip
    assert out.read_side == side and out.hit_tokens == 64  # 4 blocks (split: PE 2 + DE 2)
    own_hits = {"pe": 64, "split": 32, "de": 0}[side]
    assert sent == dict.fromkeys(range(dec.num_layers), len(follow) - 64 + own_hits)


@pytest.mark.parametrize("async_transfer", [False, True])
def test_mixed_batch_two_decoders_chunked(
    tiny_llama: tuple[Decoder, Any], kv_dir: str, async_transfer: bool
) -> None:
    """PE-path and DE-path requests in one prefill batch, chunked prefill, two DEs, unaligned prompts."""
    dec, hf = tiny_llama
    gen = torch.Generator().manual_seed(12)
    cfg = LocalConfig(kv_dir=kv_dir, block_size=16, max_batch_tokens=24, num_decode_engines=2,
                      async_transfer=async_transfer, batching="tokens")  # fmt: skip
    prompts = {"a": random_tokens(gen, 37), "b": random_tokens(gen, 16), "c": random_tokens(gen, 61)}
    with LocalPipeline(dec, cfg) as pipe:
        run_conversation(pipe, hf, prompts=prompts, gen=gen, num_turns=3,
                         sides=lambda k, t: "pe" if (ord(k) + t) % 2 else "de",
                         decode_engine=lambda k: ord(k) % 2)  # fmt: skip
        assert pipe.num_prefill_steps > 3 * 3  # the 24-token budget forced chunking
        assert pipe.store.stats().num_blocks > 0


def test_qwen2_tied_partial_hits_block_64(tiny_qwen: tuple[Decoder, Any], kv_dir: str) -> None:
    """Default block size: the second turn hits one block and computes the unaligned rest."""
    dec, hf = tiny_qwen
    gen = torch.Generator().manual_seed(13)
    with LocalPipeline(dec, LocalConfig(kv_dir=kv_dir, max_batch_tokens=50)) as pipe:
        hist = run_conversation(pipe, hf, prompts={"q": random_tokens(gen, 70)}, gen=gen,
                                num_turns=2, sides=lambda k, t: "de", gen_len=4, append_len=30)  # fmt: skip
    assert [h[f"q-t{t}"].hit_tokens for t, h in enumerate(hist)] == [0, 64]


def test_store_reopened_after_crash_mid_write(tiny_llama: tuple[Decoder, Any], kv_dir: str) -> None:
    """A leftover temp file and a truncated block: reopening treats them as misses, outputs stay exact."""
    from dualpath.runtime.kvstore import chain_hashes
    from dualpath.runtime.kvstore.files import block_path

    dec, hf = tiny_llama
    gen = torch.Generator().manual_seed(14)
    prompt = random_tokens(gen, 60)
    cfg = LocalConfig(kv_dir=kv_dir, block_size=16)
    with LocalPipeline(dec, cfg) as pipe:
        first = run_conversation(pipe, hf, prompts={"a": prompt}, gen=gen, num_turns=1,
                                 sides=lambda k, t: "pe")[0]["a-t0"]  # fmt: skip
        root = pipe.store.root
    context = prompt + list(first.tokens)
    hashes = chain_hashes(context[:-1], 16)
    assert len(hashes) == 4
    victim = block_path(root, hashes[2])
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 3])  # a torn write of block 2
    (victim.parent / f".tmp.{hashes[3]}.999.0").write_bytes(data[:100])  # a crashed writer's temp file
    follow = context + random_tokens(gen, 7)
    expected_hits = {"de": 32, "pe": 64}  # blocks 0-1 only; then block 2 was recomputed and re-persisted
    for side in ("de", "pe"):
        with LocalPipeline(dec, cfg) as pipe:
            assert hashes[2] not in pipe.store.known_hashes() or side == "pe"
            out = run_conversation(pipe, hf, prompts={"a": follow}, gen=gen, num_turns=1,
                                   sides=lambda k, t, s=side: s)[0]["a-t0"]  # fmt: skip
            assert out.hit_tokens == expected_hits[side]
            assert pipe.store.contains(hashes[2])

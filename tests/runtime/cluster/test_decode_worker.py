"""The cluster's decode worker on runtime/engine's DecodeEngine, in one process: prompt KV Layer
Blocks (some arriving before the task) and the PE's ``PrefillDone`` (the first token) in, greedy tokens equal to a
full forward out, every full block persisted, the paged cache and the DE buffer empty afterwards."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from dualpath.runtime.cluster.api import SamplingParams
from dualpath.runtime.cluster.decode_worker import DecodeWorker
from dualpath.runtime.cluster.engine_setup import engine_pools
from dualpath.runtime.cluster.kvio import BlockIO, Geometry, Outbox
from dualpath.runtime.cluster.messages import DecodeTask, ReadPlan, Tokens
from dualpath.runtime.cluster.traffic import TrafficManager
from dualpath.runtime.kvstore import BlockStore, chain_hashes
from dualpath.runtime.model import Decoder, Span, load_decoder
from dualpath.runtime.model.tiny import TinySpec, make_tiny_checkpoint
from dualpath.runtime.transfer import PrefillDone, TransferItem
from dualpath.runtime.transfer.inproc import InProcFabric, InProcTransport

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Decoder:
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), TinySpec(seed=3))
    return load_decoder(str(path), device="cpu")[0]


NO_HITS = ReadPlan(side="pe", pe_read_len=0, de_read_len=0)


def _prefill_items(
    dec: Decoder, rid: str, prompt: list[int], bs: int
) -> tuple[list[TransferItem], PrefillDone]:
    """What a PE sends: each layer's prompt KV as one span item, then ``PrefillDone``."""
    with torch.inference_mode():
        spans = [Span(0, len(prompt))]
        h, rope = dec.embed(prompt), dec.rope(dec.positions(spans))
        items = []
        for layer in range(dec.num_layers):
            h, kv = dec.run_layer(layer, h, spans, [None], rope)
            items.append(
                TransferItem(key=rid, block_index=0, layer=layer, num_tokens=len(prompt), payload=kv.clone())
            )
        first = int(torch.argmax(dec.final(h[-1:])[0]).item())
    return items, PrefillDone(key=rid, first_token=first)


def _reference(dec: Decoder, prompt: list[int], n: int) -> list[int]:
    ids, out = list(prompt), []
    with torch.inference_mode():
        for _ in range(n):
            out.append(int(torch.argmax(dec.forward_full(ids)[-1]).item()))
            ids.append(out[-1])
    return out


def test_decode_worker_runs_the_paged_engine(decoder: Decoder, tmp_path: Path) -> None:
    bs, gen = 16, 7
    geo = Geometry.of(decoder, bs)
    store = BlockStore(str(tmp_path / "kv"), geo.layout())
    traffic = TrafficManager(
        engine_id=1, node_id=1, snic_gbps=None, cnic_gbps=None, shared_dir=tmp_path / "links"
    )
    fabric, outbox = InProcFabric(), Outbox()
    transport = InProcTransport(fabric)
    io = BlockIO(store, geo, traffic)
    worker = DecodeWorker(
        engine_id=1,
        node_id=1,
        decoder=decoder,
        geo=geo,
        blockio=io,
        transport=transport,
        outbox=outbox,
        eos_token_id=None,
        pools=engine_pools("decode", "4MiB", geo, 4096),
    )
    transport.bind("e1", worker)
    gen_rng = torch.Generator().manual_seed(0)
    prompts = {f"r{i}": torch.randint(3, 200, (40 + 13 * i,), generator=gen_rng).tolist() for i in range(2)}
    params = SamplingParams(max_tokens=gen, ignore_eos=True)
    tasks = {rid: DecodeTask(request_id=rid, prompt_token_ids=p, read=NO_HITS, prefill_engine=0,
                             params=params)
             for rid, p in prompts.items()}  # fmt: skip
    items, done = _prefill_items(decoder, "r0", prompts["r0"], bs)
    transport.submit("e1", items)  # before its task (held, KV first, then PrefillDone)
    transport.notify("e1", [done])
    worker.add(tasks["r0"])
    worker.add(tasks["r1"])
    items, done = _prefill_items(decoder, "r1", prompts["r1"], bs)
    transport.submit("e1", items)
    transport.notify("e1", [done])
    tokens: dict[str, list[int]] = {rid: [] for rid in prompts}
    finished: set[str] = set()
    for _ in range(200):
        if worker.has_work():
            worker.step()
        flushed = threading.Event()  # the last token of a request comes after its persists
        io.after_writes(flushed.set)
        assert flushed.wait(10)
        for msg in outbox.drain():
            assert isinstance(msg, Tokens)
            for ev in msg.events:
                assert ev.index == len(tokens[ev.request_id])
                tokens[ev.request_id].append(ev.token_id)
                if ev.finish_reason is not None:
                    assert ev.finish_reason == "length"
                    finished.add(ev.request_id)
        if finished == set(prompts):
            break
    assert finished == set(prompts)
    for rid, p in prompts.items():
        assert tokens[rid] == _reference(decoder, p, gen)
        # every block whose tokens all have KV (prompt + all but the last token) is in the store
        full = chain_hashes(p + tokens[rid][:-1], bs)
        assert full and all(store.read_full(h) is not None for h in full)
    eng = worker.engine
    assert eng.num_running == 0 and eng.cache.num_free_blocks == eng.config.num_cache_blocks
    assert eng.buffer.num_free_blocks * geo.layout().full_block_bytes == eng.buffer.capacity_bytes
    assert worker.load() == (0, 0)
    paths, _ = traffic.snapshot()
    assert paths["persist"] == len(store.known_hashes()) * geo.layout().full_block_bytes
    io.close()
    transport.close()
    traffic.close()


def test_outbox_express_messages_wake_the_sender_and_skip_the_main_queue() -> None:
    box = Outbox()
    box.put("token")
    assert not box.wake.is_set()
    box.put_express("read_done")
    assert box.wake.is_set()
    assert box.drain_express() == ["read_done"]
    assert not box.wake.is_set()
    assert box.drain() == ["token"]

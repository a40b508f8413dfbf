"""Per-request isolation in the workers (in one process, on the real engines and the tiny model):
a request whose first token is out of the vocabulary fails alone on the DE; a decode step that
raises fails the requests in it, frees their cache and buffers, and the worker decodes the next
request normally; a PE batch that raises is retried request by request, and only the request that
fails alone is failed, while the other is prefilled and decoded."""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path

import pytest
import torch

from dualpath.runtime.cluster.api import SamplingParams
from dualpath.runtime.cluster.decode_worker import DecodeWorker
from dualpath.runtime.cluster.engine_setup import engine_pools
from dualpath.runtime.cluster.kvio import BlockIO, Geometry, Outbox
from dualpath.runtime.cluster.messages import DecodeTask, Progress, Tokens
from dualpath.runtime.cluster.traffic import TrafficManager
from dualpath.runtime.kvstore import BlockStore
from dualpath.runtime.model import Decoder, load_decoder
from dualpath.runtime.model.tiny import TinySpec, make_tiny_checkpoint
from dualpath.runtime.transfer import PrefillDone
from dualpath.runtime.transfer.inproc import InProcFabric, InProcTransport

torch.set_num_threads(1)


def _sibling(name: str):  # tests run with --import-mode=importlib: load the helper by path
    spec = importlib.util.spec_from_file_location(
        f"dualpath_test_{name}", Path(__file__).with_name(f"{name}.py")
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


_prefill_items = _sibling("test_decode_worker")._prefill_items
NO_HITS = _sibling("test_decode_worker").NO_HITS


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Decoder:
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), TinySpec(seed=3))
    return load_decoder(str(path), device="cpu")[0]


class _Rig:
    def __init__(self, decoder: Decoder, tmp: Path) -> None:
        self.dec, self.bs = decoder, 16
        self.geo = Geometry.of(decoder, self.bs)
        self.traffic = TrafficManager(
            engine_id=1, node_id=1, snic_gbps=None, cnic_gbps=None, shared_dir=tmp / "links"
        )
        self.fabric = InProcFabric()
        self.outbox, self.transport = Outbox(), InProcTransport(self.fabric)
        self.io = BlockIO(BlockStore(str(tmp / "kv"), self.geo.layout()), self.geo, self.traffic)
        self.worker = DecodeWorker(
            engine_id=1,
            node_id=1,
            decoder=decoder,
            geo=self.geo,
            blockio=self.io,
            transport=self.transport,
            outbox=self.outbox,
            eos_token_id=None,
            pools=engine_pools("decode", "4MiB", self.geo, 4096),
        )
        self.transport.bind("e1", self.worker)

    def start(self, rid: str, prompt: list[int], first_token: int | None = None) -> None:
        self.worker.add(
            DecodeTask(
                request_id=rid,
                prompt_token_ids=prompt,
                read=NO_HITS,
                prefill_engine=0,
                params=SamplingParams(max_tokens=5, ignore_eos=True),
            )
        )
        items, done = _prefill_items(self.dec, rid, prompt, self.bs)
        if first_token is not None:
            done = PrefillDone(key=rid, first_token=first_token)
        self.transport.submit("e1", items)
        self.transport.notify("e1", [done])

    def run(self, steps: int = 30) -> tuple[dict[str, list[int]], dict[str, str]]:
        tokens: dict[str, list[int]] = {}
        failed: dict[str, str] = {}
        for _ in range(steps):
            if self.worker.has_work():
                self.worker.step()
            done = threading.Event()
            self.io.after_writes(done.set)
            assert done.wait(10)
            for msg in self.outbox.drain():
                if isinstance(msg, Progress):
                    assert msg.event == "failed"
                    failed[msg.request_id] = msg.error or ""
                else:
                    assert isinstance(msg, Tokens)
                    for ev in msg.events:
                        tokens.setdefault(ev.request_id, []).append(ev.token_id)
        return tokens, failed

    def assert_empty(self) -> None:
        eng = self.worker.engine
        assert eng.num_running == 0 and eng.cache.num_free_blocks == eng.config.num_cache_blocks
        assert eng.buffer.num_free_blocks * self.geo.layout().full_block_bytes == eng.buffer.capacity_bytes
        assert self.worker.load() == (0, 0)

    def close(self) -> None:
        self.io.close()
        self.transport.close()
        self.traffic.close()


@pytest.fixture
def rig(decoder: Decoder, tmp_path: Path):
    r = _Rig(decoder, tmp_path)
    yield r
    r.close()


def test_a_first_token_out_of_the_vocabulary_fails_that_request_alone(rig: _Rig) -> None:
    rig.start("bad", list(range(3, 40)), first_token=10**9)
    rig.start("good", list(range(5, 50)))
    tokens, failed = rig.run()
    assert set(failed) == {"bad"} and "could not start decoding" in failed["bad"]
    assert len(tokens["good"]) == 5 and "bad" not in tokens
    assert rig.worker.num_failed_requests == 1
    rig.assert_empty()


def test_a_decode_step_that_raises_fails_its_requests_and_the_worker_serves_on(rig: _Rig) -> None:
    rig.start("a", list(range(3, 40)))
    rig.start("b", list(range(5, 50)))
    real_step = rig.worker.engine.step
    calls = {"n": 0}

    def flaky_step():  # the second decode step raises (an injected engine fault)
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected fault")
        return real_step()

    rig.worker.engine.step = flaky_step  # type: ignore[method-assign]
    tokens, failed = rig.run()
    assert set(failed) == {"a", "b"} and all("decode step failed" in e for e in failed.values())
    assert all("injected" not in e for e in failed.values())  # no exception text to clients
    rig.assert_empty()
    rig.start("c", list(range(7, 44)))
    tokens, failed = rig.run()
    assert not failed and len(tokens["c"]) == 5
    rig.assert_empty()


def test_a_prefill_batch_that_raises_fails_only_the_request_that_fails_alone(
    rig: _Rig, tmp_path: Path
) -> None:
    from dualpath.policy import SchedulerConfig, make_scheduler
    from dualpath.runtime.cluster.messages import PrefillTask
    from dualpath.runtime.cluster.prefill_worker import PrefillWorker

    pe_out = Outbox()
    pe_transport = InProcTransport(rig.fabric)
    pe_traffic = TrafficManager(
        engine_id=0, node_id=0, snic_gbps=None, cnic_gbps=None, shared_dir=tmp_path / "links"
    )
    pe_io = BlockIO(rig.io.store, rig.geo, pe_traffic)
    pe = PrefillWorker(
        engine_id=0,
        node_id=0,
        decoder=rig.dec,
        geo=rig.geo,
        blockio=pe_io,
        transport=pe_transport,
        outbox=pe_out,
        scheduler=make_scheduler("basic", SchedulerConfig(block_size=rig.bs)),
        pools=engine_pools("prefill", "4MiB", rig.geo, 4096),
    )
    pe_transport.bind("e0", pe)
    real_step = pe.engine.step
    batches: list[list[str]] = []

    def poisoned_step(entries):  # an injected fault: any batch holding "bad" raises
        batches.append([e.request_id for e in entries])
        if any(e.request_id == "bad" for e in entries):
            raise RuntimeError("injected fault")
        return real_step(entries)

    pe.engine.step = poisoned_step  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    for rid, prompt in (("bad", list(range(3, 40))), ("good", list(range(5, 50)))):
        rig.worker.add(
            DecodeTask(request_id=rid, prompt_token_ids=prompt, read=NO_HITS, prefill_engine=0, params=params)
        )
        pe.add(
            PrefillTask(request_id=rid, prompt_token_ids=prompt, read=NO_HITS, decode_engine=1, params=params)
        )
    for _ in range(10):
        pe.step()
    failed = {
        m.request_id: m.error for m in pe_out.drain() if isinstance(m, Progress) and m.event == "failed"
    }
    assert set(failed) == {"bad"} and "prefill failed" in (failed["bad"] or "")
    assert batches[0] == ["bad", "good"] and ["good"] in batches and batches.count(["bad"]) == 1
    rig.worker.cancel("bad")  # (what the scheduler's Cancel does on the DE)
    tokens, dfailed = rig.run()
    assert not dfailed and len(tokens["good"]) == 3
    assert pe.engine.num_requests == 0 and pe.num_failed_requests == 1
    rig.assert_empty()
    pe_io.close()
    pe_traffic.close()


def test_a_timed_out_hand_off_is_prefilled_again_without_another_request(
    decoder: Decoder, tmp_path: Path
) -> None:
    """The lost-at-start case (issue 30 item 3) in one process: the DE's endpoint holds the PE's KV
    until the DE worker exists (the engine's ``SinkGate``), longer than the PE's transfer timeout;
    the PE's batch fails with a TransferError and goes back into its queue. It must be prefilled
    again by itself: before, it was re-admitted only when another task arrived, so with no later
    request it waited in the PE forever (every request sent right after /health said ok, lost)."""
    from dualpath.policy import SchedulerConfig, make_scheduler
    from dualpath.runtime.cluster.engine_setup import SinkGate
    from dualpath.runtime.cluster.messages import PrefillTask
    from dualpath.runtime.cluster.prefill_worker import TRANSFER_TIMEOUT_S, PrefillWorker

    bs, geo, fabric = 16, Geometry.of(decoder, 16), InProcFabric()
    store = BlockStore(str(tmp_path / "kv"), geo.layout())
    links = tmp_path / "links"
    de_traffic = TrafficManager(engine_id=1, node_id=1, snic_gbps=None, cnic_gbps=None, shared_dir=links)
    pe_traffic = TrafficManager(engine_id=0, node_id=0, snic_gbps=None, cnic_gbps=None, shared_dir=links)
    de_io, pe_io = BlockIO(store, geo, de_traffic), BlockIO(store, geo, pe_traffic)
    de_out, pe_out = Outbox(), Outbox()
    de_transport, pe_transport = (
        InProcTransport(fabric, asynchronous=True),
        InProcTransport(fabric, asynchronous=True),
    )
    gate = SinkGate()
    de_transport.bind("e1", gate)  # the DE endpoint exists; its worker does not yet
    pe = PrefillWorker(engine_id=0, node_id=0, decoder=decoder, geo=geo, blockio=pe_io, transport=pe_transport,
                       outbox=pe_out, scheduler=make_scheduler("basic", SchedulerConfig(block_size=bs)),
                       pools=engine_pools("prefill", "4MiB", geo, 4096))  # fmt: skip
    pe_transport.bind("e0", pe)
    params, prompt = SamplingParams(max_tokens=3, ignore_eos=True), list(range(4, 45))
    pe.add(PrefillTask(request_id="r", prompt_token_ids=prompt, read=NO_HITS, decode_engine=1, params=params))
    assert pe.step()  # waits TRANSFER_TIMEOUT_S for the DE's ack, then puts "r" back
    de = DecodeWorker(engine_id=1, node_id=1, decoder=decoder, geo=geo, blockio=de_io, transport=de_transport,
                      outbox=de_out, eos_token_id=None, pools=engine_pools("decode", "4MiB", geo, 4096))  # fmt: skip
    de.add(DecodeTask(request_id="r", prompt_token_ids=prompt, read=NO_HITS, prefill_engine=0, params=params))
    gate.open(de)  # the DE worker is built: the held KV goes in
    for _ in range(int(10 * TRANSFER_TIMEOUT_S)):
        if not pe.has_work():
            break
        pe.step()
    assert pe.engine.num_requests == 0, "the retried request was never prefilled again"
    tokens: list[int] = []
    for _ in range(100):
        if de.has_work():
            de.step()
        for msg in de_out.drain():
            if isinstance(msg, Tokens):
                tokens += [ev.token_id for ev in msg.events]
        if len(tokens) == 3:
            break
        threading.Event().wait(0.05)
    assert len(tokens) == 3
    for closer in (de_io, pe_io, de_transport, pe_transport, de_traffic, pe_traffic):
        closer.close()

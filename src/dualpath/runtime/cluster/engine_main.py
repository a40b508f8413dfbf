"""One engine process (prefill or decode): loads the model, opens the shared KV store, binds its
transport endpoint ``e<engine_id>``, registers with the scheduler and runs its main loop.

The main thread owns the scheduler socket and the compute; a heartbeat thread (own socket) reports
load, read queue and byte counters every ``heartbeat_s`` even while a long batch runs.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec
import torch
import zmq

from dualpath.runtime.cluster.config import EngineArgs
from dualpath.runtime.cluster.kvio import BlockIO, Geometry, Outbox
from dualpath.runtime.cluster.messages import (
    DECODE_ERRORS, Cancel, Configure, DecodeTask, EngineHello, Heartbeat, Peers, PrefillTask, Reset,
    Shutdown, Welcome, decode, encode,
)
from dualpath.runtime.cluster.traffic import TrafficManager, links_dir
from dualpath.runtime.transfer.auth import ClusterKeys, load_keys
from dualpath.runtime.transfer.drops import DropCounter

if TYPE_CHECKING:
    from dualpath.policy import SchedulerConfig


def _capacity(args: EngineArgs) -> int | None | str:
    return "auto" if args.kv_capacity_bytes is None else args.kv_capacity_bytes


def _model(args: EngineArgs) -> tuple[object, Geometry, int | None, int, int]:
    from dualpath.runtime.model import load_decoder

    eng = args.cluster.engine
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[eng.dtype]
    decoder, ckpt = load_decoder(args.cluster.model, device="cpu", dtype=dtype)
    eos = getattr(ckpt.hf_config, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, list) else eos
    return (decoder, Geometry.of(decoder, eng.block_size), eos, ckpt.config.vocab_size,
            ckpt.config.max_position_embeddings)


def run_engine(args: EngineArgs) -> None:
    """Run until the scheduler sends Shutdown or goes away for good."""
    torch.set_num_threads(1)
    from dualpath.policy import make_scheduler
    from dualpath.runtime.kvstore import BlockStore
    from dualpath.runtime.transfer.factory import make_transport

    decoder, geo, eos, vocab, max_ctx = _model(args)
    sched_cfg = _sched_config(args, decoder) if args.role == "prefill" else None  # before registering
    layout = geo.layout()
    cluster = args.cluster
    hbm_tokens = cluster.engine.decode_hbm_tokens if args.role == "decode" else 0
    store = BlockStore(cluster.kv_dir, layout, _capacity(args), file_mode=cluster.kv_file_mode)
    keys = load_keys(args.key_file)
    ctx = zmq.Context()
    sock = _dealer(ctx, args.scheduler, keys)
    traffic = _traffic(args, max(args.engine_id, 0))
    transport = make_transport(cluster.transport, host=cluster.host, limiter=traffic.kv_send, keys=keys)
    sock.send(encode(EngineHello(
        engine_id=args.engine_id, role=args.role, node_id=args.node_id,
        data_addr=transport.address, pid=os.getpid(),  # type: ignore[attr-defined]
        hbm_tokens=hbm_tokens, model_name=cluster.model,
        num_layers=geo.num_layers, kv_bytes_per_token_layer=layout.kv_bytes_per_token_layer,
        block_size=geo.block_size, vocab_size=vocab, eos_token_id=eos, max_context_len=max_ctx)))
    welcome = decode(sock.recv())
    if isinstance(welcome, Shutdown):
        raise SystemExit(f"engine ({args.role}, node {args.node_id}): the scheduler {welcome.reason}")
    assert isinstance(welcome, Welcome), welcome
    eid = welcome.engine_id
    drops: DropCounter = transport.drops  # type: ignore[attr-defined]  # one counter per process
    drops.who = f"engine {eid} ({args.role})"
    data_addr = transport.address  # type: ignore[attr-defined]
    print(f"engine {eid} ({args.role}, node {args.node_id}): data plane at {data_addr}", flush=True)
    gate = _Gate()  # KV may come as soon as the scheduler knows us: hold it until the worker exists
    transport.bind(f"e{eid}", gate)
    traffic.close()
    traffic = _traffic(args, eid)
    transport.limiter = traffic.kv_send  # type: ignore[attr-defined]
    outbox, io = Outbox(), BlockIO(store, geo, traffic)
    common = dict(engine_id=eid, node_id=args.node_id, decoder=decoder, geo=geo, blockio=io,
                  transport=transport, outbox=outbox)
    worker: object
    if args.role == "prefill":
        from dualpath.runtime.cluster.prefill_worker import PrefillWorker

        worker = PrefillWorker(scheduler=make_scheduler(cluster.policy, sched_cfg), **common)  # type: ignore[arg-type]
    else:
        from dualpath.runtime.cluster.decode_worker import DecodeWorker

        worker = DecodeWorker(eos_token_id=eos, hbm_tokens=hbm_tokens, **common)  # type: ignore[arg-type]
    gate.open(worker)
    _set_peers(transport, welcome.peers, eid)
    stop = threading.Event()
    hb = threading.Thread(target=_heartbeats, args=(ctx, args, eid, worker, io, traffic, stop, keys),
                          daemon=True)
    hb.start()
    try:
        _loop(sock, worker, outbox, transport, eid, lambda m: _configure(m, worker, traffic), drops)
    finally:
        stop.set()
        outbox.wake.set()
        hb.join(2)
        io.close()
        transport.close()
        traffic.close()
        sock.close(0)
        ctx.term()


def _traffic(args: EngineArgs, engine_id: int) -> TrafficManager:
    t = args.cluster.traffic
    return TrafficManager(engine_id=engine_id, node_id=args.node_id, snic_gbps=t.snic_gbps,
                          cnic_gbps=t.cnic_gbps, shared_dir=links_dir(args.cluster_id),
                          read_free=t.read_free, snic_directions=t.snic_directions)


class _Gate:
    """The engine's transport sink: waits (on the receive thread) until the worker is built."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._sink: object = None

    def open(self, sink: object) -> None:
        self._sink = sink
        self._ready.set()

    def deliver(self, source: str, items: object) -> None:
        if not self._ready.wait(120.0):
            raise RuntimeError("engine worker not ready")
        self._sink.deliver(source, items)  # type: ignore[attr-defined]


def _set_peers(transport: object, peers: dict[int, str], me: int) -> None:
    routes = transport.routes()  # type: ignore[attr-defined]
    for pid, addr in peers.items():
        if pid != me:
            transport.add_route(f"e{pid}", addr)  # type: ignore[attr-defined]
    for name in routes:  # (``e<id>.<x>`` names are this engine's local endpoints)
        if name != f"e{me}" and name[1:].isdigit() and int(name[1:]) not in peers:
            transport.fail_endpoint(name, f"engine {name[1:]} is gone")  # type: ignore[attr-defined]


def _sched_config(args: EngineArgs, decoder: object) -> SchedulerConfig:
    """A PE's policy knobs: the measured (or fixed) whole-forward attention predictor and the quota
    for dualpath*'s "quota" batching; the token budget for the baselines' "tokens" batching (the
    policy's registry picks the mode)."""
    from dualpath.policy import SchedulerConfig
    from dualpath.runtime.engine.profile import attention_predictor, fixed_predictor

    eng = args.cluster.engine
    fixed = None
    if eng.attention_s_per_gflop > 0:
        fixed = fixed_predictor(decoder, seconds_per_gflop=eng.attention_s_per_gflop,  # type: ignore[arg-type]
                                intercept_s=eng.attention_intercept_s)
    pred = attention_predictor(decoder, fixed=fixed)  # type: ignore[arg-type]
    print(f"attention predictor ({'fixed' if fixed else 'measured'}): {pred.seconds_per_gflop:.4f} s/GFLOP, "
          f"intercept {pred.intercept_s * 1e3:.3f} ms per forward of {pred.num_layers} layers; "
          f"quota {eng.compute_quota_s * 1e3:.0f} ms", flush=True)
    return SchedulerConfig(compute_quota_s=eng.compute_quota_s, attention_predictor=pred,
                           max_batch_tokens=eng.max_batch_tokens, block_size=eng.block_size)


def _configure(msg: Configure, worker: object, traffic: TrafficManager) -> None:
    from dualpath.policy import make_scheduler

    traffic.read_free = msg.read_free
    if msg.snic_gbps is not None:
        traffic.set_snic_gbps(msg.snic_gbps)
    if hasattr(worker, "scheduler"):  # same knobs (and fitted predictor), the new policy's mode
        worker.scheduler = make_scheduler(msg.policy, worker.scheduler.config)


MAX_STEP_FAILURES = 5  # consecutive steps raising out of the worker: the engine is broken, exit


def _loop(sock: zmq.Socket, worker: object, outbox: Outbox, transport: object, eid: int,
          configure: Callable[[Configure], None], drops: DropCounter) -> None:
    """Serve until Shutdown. A message that does not decode, or whose handling raises, is dropped
    and counted (a task whose handling raises is failed alone); the workers isolate per-request
    failures in their steps. Only ``MAX_STEP_FAILURES`` steps in a row raising out of the worker
    (the engine itself is broken) end the loop with that error."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    step_failures = 0
    while True:
        busy = worker.has_work()  # type: ignore[attr-defined]
        for s, _ in poller.poll(0 if busy else 2):
            while True:
                try:
                    raw = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    msg = decode(raw)
                except DECODE_ERRORS as exc:
                    drops.drop("control", "invalid" if isinstance(exc, msgspec.ValidationError)
                               else "undecodable", str(exc))
                    continue
                if isinstance(msg, Shutdown):
                    return
                try:
                    _handle(msg, worker, transport, eid, configure, drops)
                except Exception as exc:  # noqa: BLE001 - one message must not end the engine
                    drops.drop("control", "handler_error",
                               f"{type(msg).__name__}: {type(exc).__name__}: {exc}")
                    if isinstance(msg, (PrefillTask, DecodeTask)):
                        worker.fail_task(  # type: ignore[attr-defined]
                            msg.request_id, "the task could not be taken (see the engine log)", exc)
        if busy:
            try:
                worker.step()  # type: ignore[attr-defined]
                step_failures = 0
            except Exception:
                step_failures += 1
                traceback.print_exc()
                if step_failures >= MAX_STEP_FAILURES:
                    print(f"engine {eid}: {step_failures} steps in a row failed; exiting", flush=True)
                    raise
        for out in outbox.drain():
            sock.send(encode(out))  # type: ignore[arg-type]


def _handle(msg: object, worker: object, transport: object, eid: int,
            configure: Callable[[Configure], None], drops: DropCounter) -> None:
    if isinstance(msg, (PrefillTask, DecodeTask)):
        worker.add(msg)  # type: ignore[attr-defined]
    elif isinstance(msg, Cancel):
        worker.cancel(msg.request_id)  # type: ignore[attr-defined]
    elif isinstance(msg, Reset):
        print(f"engine {eid}: reset by the scheduler ({msg.reason})", flush=True)
        worker.reset()  # type: ignore[attr-defined]
    elif isinstance(msg, Peers):
        _set_peers(transport, msg.peers, eid)
    elif isinstance(msg, Configure):
        configure(msg)
    else:  # engine -> scheduler messages never come this way
        drops.drop("control", "unexpected", type(msg).__name__)


def _dealer(ctx: zmq.Context, address: str, keys: ClusterKeys | None) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        keys.client(sock)
    sock.connect(address)
    return sock


def _heartbeats(ctx: zmq.Context, args: EngineArgs, eid: int, worker: object, io: BlockIO,
                traffic: TrafficManager, stop: threading.Event, keys: ClusterKeys | None) -> None:
    sock = _dealer(ctx, args.scheduler, keys)
    outbox: Outbox = worker.outbox  # type: ignore[attr-defined]
    transport_drops: DropCounter = worker.transport.drops  # type: ignore[attr-defined]
    next_s = time.monotonic() + args.cluster.engine.heartbeat_s
    try:
        while not stop.is_set():
            outbox.wake.wait(max(next_s - time.monotonic(), 0.0))
            for msg in outbox.drain_express():
                sock.send(encode(msg))  # type: ignore[arg-type]
            if time.monotonic() < next_s:
                continue
            next_s = time.monotonic() + args.cluster.engine.heartbeat_s
            seqs, toks = worker.load()  # type: ignore[attr-defined]
            paths, nics = traffic.snapshot()
            st = io.store.stats()
            sock.send(encode(Heartbeat(engine_id=eid, num_seqs=seqs, num_tokens=toks,
                                       read_queue_tokens=io.read_queue_tokens,
                                       bytes_by_path=paths, bytes_by_nic=nics,
                                       store_counts=st.health_counts(),
                                       store_write_errors=st.write_errors,
                                       dropped=transport_drops.snapshot(),
                                       failed_requests=worker.num_failed_requests)))  # type: ignore[attr-defined]
    finally:
        sock.close(0)


def main() -> None:
    """``python -m dualpath.runtime.cluster.engine_main '<EngineArgs as JSON>'``."""
    import sys

    run_engine(msgspec.json.decode(sys.argv[1].encode(), type=EngineArgs))


if __name__ == "__main__":
    main()

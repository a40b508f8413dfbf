"""One engine process (prefill or decode): loads the model, opens the shared KV store, binds its
transport endpoint ``e<engine_id>``, registers with the scheduler and runs its main loop.

The main thread owns the scheduler socket and the compute; a heartbeat thread (own socket,
runtime/cluster/engine_beat.py) runs from process start: it reports the engine as loading until it
registers, then load, read queue and byte counters every ``heartbeat_s`` even while a long batch
runs. When a restarted scheduler does not know the engine, the engine drops its tasks and registers
again with the same id (the scheduler rebuilds its state from these registrations).
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec
import torch
import zmq

from dualpath.runtime.cluster.config import EngineArgs
from dualpath.runtime.cluster.engine_beat import Beat, dealer
from dualpath.runtime.cluster.kvio import BlockIO, Geometry, Outbox
from dualpath.runtime.cluster.messages import (
    DECODE_ERRORS,
    Cancel,
    Configure,
    DecodeTask,
    EngineHello,
    Peers,
    PrefillTask,
    Reset,
    Shutdown,
    Welcome,
    decode,
    encode,
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

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.cluster.engine.dtype]
    decoder, ckpt = load_decoder(args.cluster.model, device="cpu", dtype=dtype)
    eos = getattr(ckpt.hf_config, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, list) else eos
    return (
        decoder,
        Geometry.of(decoder, args.cluster.engine.block_size),
        eos,
        ckpt.config.vocab_size,
        ckpt.config.max_position_embeddings,
    )


Loaded = tuple[object, Geometry, "int | None", int, int]  # what _model returns


def run_engine(args: EngineArgs, loaded: Loaded | None = None) -> None:
    """Run until the scheduler sends Shutdown (an engine the scheduler forgot registers again).
    ``loaded``: the model as ``_model(args)`` returns it, loaded already (a standby)."""
    torch.set_num_threads(1)
    keys = load_keys(args.key_file)
    ctx = zmq.Context()
    beat = Beat(ctx, args, keys)  # "loading" from now on, heartbeats once registered
    beat.start()
    try:
        _run(args, ctx, keys, beat, loaded)
    finally:
        beat.close()
        ctx.term()


def _run(
    args: EngineArgs, ctx: zmq.Context, keys: ClusterKeys | None, beat: Beat, loaded: Loaded | None
) -> None:
    from dualpath.policy import make_scheduler
    from dualpath.runtime.kvstore import BlockStore
    from dualpath.runtime.transfer.factory import make_transport

    decoder, geo, eos, vocab, max_ctx = loaded or _model(args)
    sched_cfg = _sched_config(args, decoder) if args.role == "prefill" else None  # before registering
    layout = geo.layout()
    store = BlockStore(args.cluster.kv_dir, layout, _capacity(args), file_mode=args.cluster.kv_file_mode)
    sock = dealer(ctx, args.scheduler, keys)
    traffic = _traffic(args, max(args.engine_id, 0))
    transport = make_transport(
        args.cluster.transport, host=args.cluster.host, limiter=traffic.kv_send, keys=keys
    )
    hello = EngineHello(
        engine_id=args.engine_id,
        role=args.role,
        node_id=args.node_id,  # type: ignore[arg-type]
        data_addr=transport.address,
        pid=os.getpid(),  # type: ignore[attr-defined]
        hbm_tokens=args.cluster.engine.decode_hbm_tokens if args.role == "decode" else 0,
        model_name=args.cluster.model,
        num_layers=geo.num_layers,
        kv_bytes_per_token_layer=layout.kv_bytes_per_token_layer,
        block_size=geo.block_size,
        vocab_size=vocab,
        eos_token_id=eos,
        max_context_len=max_ctx,
    )
    sock.send(encode(hello))
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
    common = dict(
        engine_id=eid,
        node_id=args.node_id,
        decoder=decoder,
        geo=geo,
        blockio=io,
        transport=transport,
        outbox=outbox,
    )
    worker: object
    if args.role == "prefill":
        from dualpath.runtime.cluster.prefill_worker import PrefillWorker

        worker = PrefillWorker(scheduler=make_scheduler(args.cluster.policy, sched_cfg), **common)  # type: ignore[arg-type]
    else:
        from dualpath.runtime.cluster.decode_worker import DecodeWorker

        worker = DecodeWorker(eos_token_id=eos, hbm_tokens=args.cluster.engine.decode_hbm_tokens, **common)  # type: ignore[arg-type]
    gate.open(worker)
    _set_peers(transport, welcome.peers, eid)
    beat.attach(eid, worker, io, traffic)
    again = _Reregister(beat.reregister, msgspec.structs.replace(hello, engine_id=eid))
    try:
        _loop(sock, worker, outbox, transport, eid, lambda m: _configure(m, worker, traffic), drops, again)
    finally:
        beat.close()
        io.close()
        transport.close()
        traffic.close()
        sock.close(0)


class _Reregister:
    """Registering again with a scheduler that lost this engine (it restarted): drop every task,
    send the hello (same id); the Welcome (or a refusal) comes back through the main loop."""

    def __init__(self, flag: threading.Event, hello: EngineHello) -> None:
        self.flag, self.hello = flag, hello

    def __call__(self, sock: zmq.Socket, worker: object) -> None:
        if not self.flag.is_set():
            return
        self.flag.clear()
        print(
            f"engine {self.hello.engine_id}: the scheduler does not know this engine (it "
            "restarted); dropping every task and registering again",
            flush=True,
        )
        worker.reset()  # type: ignore[attr-defined]
        sock.send(encode(self.hello))


def _traffic(args: EngineArgs, engine_id: int) -> TrafficManager:
    t = args.cluster.traffic
    return TrafficManager(
        engine_id=engine_id,
        node_id=args.node_id,
        snic_gbps=t.snic_gbps,
        cnic_gbps=t.cnic_gbps,
        shared_dir=links_dir(args.cluster_id),
        read_free=t.read_free,
        snic_directions=t.snic_directions,
    )


class _Gate:
    """The engine's transport sink (KV and control messages): waits (on the receive thread) until
    the worker is built."""

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

    def control(self, source: str, msgs: object) -> None:
        if not self._ready.wait(120.0):
            raise RuntimeError("engine worker not ready")
        self._sink.control(source, msgs)  # type: ignore[attr-defined]


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

    fixed = None
    if args.cluster.engine.attention_s_per_gflop > 0:
        fixed = fixed_predictor(
            decoder,
            seconds_per_gflop=args.cluster.engine.attention_s_per_gflop,  # type: ignore[arg-type]
            intercept_s=args.cluster.engine.attention_intercept_s,
        )
    pred = attention_predictor(decoder, fixed=fixed)  # type: ignore[arg-type]
    print(
        f"attention predictor ({'fixed' if fixed else 'measured'}): {pred.seconds_per_gflop:.4f} s/GFLOP, "
        f"intercept {pred.intercept_s * 1e3:.3f} ms per forward of {pred.num_layers} layers; "
        f"quota {args.cluster.engine.compute_quota_s * 1e3:.0f} ms",
        flush=True,
    )
    return SchedulerConfig(
        compute_quota_s=args.cluster.engine.compute_quota_s,
        attention_predictor=pred,
        max_batch_tokens=args.cluster.engine.max_batch_tokens,
        block_size=args.cluster.engine.block_size,
    )


def _configure(msg: Configure, worker: object, traffic: TrafficManager) -> None:
    from dualpath.policy import make_scheduler

    traffic.read_free = msg.read_free
    if msg.snic_gbps is not None:
        traffic.set_snic_gbps(msg.snic_gbps)
    if hasattr(worker, "scheduler"):  # same knobs (and fitted predictor), the new policy's mode
        worker.scheduler = make_scheduler(msg.policy, worker.scheduler.config)


MAX_STEP_FAILURES = 5  # consecutive steps raising out of the worker: the engine is broken, exit


def _loop(
    sock: zmq.Socket,
    worker: object,
    outbox: Outbox,
    transport: object,
    eid: int,
    configure: Callable[[Configure], None],
    drops: DropCounter,
    again: Callable[[zmq.Socket, object], None] = lambda s, w: None,
) -> None:
    """Serve until Shutdown. A message that does not decode, or whose handling raises, is dropped
    and counted (a task whose handling raises is failed alone); the workers isolate per-request
    failures in their steps. Only ``MAX_STEP_FAILURES`` steps in a row raising out of the worker
    (the engine itself is broken) end the loop with that error."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    step_failures = 0
    while True:
        again(sock, worker)
        busy = worker.has_work()  # type: ignore[attr-defined]
        for _sock, _ in poller.poll(0 if busy else 2):
            while True:
                try:
                    raw = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    msg = decode(raw)
                except DECODE_ERRORS as exc:
                    drops.drop(
                        "control",
                        "invalid" if isinstance(exc, msgspec.ValidationError) else "undecodable",
                        str(exc),
                    )
                    continue
                if isinstance(msg, Shutdown):
                    print(f"engine {eid}: stopped by the scheduler ({msg.reason})", flush=True)
                    return
                if isinstance(msg, Welcome) and msg.engine_id != eid:  # (registered again)
                    print(f"engine {eid}: registered again as {msg.engine_id}; exiting", flush=True)
                    return
                try:
                    _handle(msg, worker, transport, eid, configure, drops)
                except Exception as exc:  # noqa: BLE001 - one message must not end the engine
                    drops.drop(
                        "control", "handler_error", f"{type(msg).__name__}: {type(exc).__name__}: {exc}"
                    )
                    if isinstance(msg, (PrefillTask, DecodeTask)):
                        worker.fail_task(  # type: ignore[attr-defined]
                            msg.request_id, "the task could not be taken (see the engine log)", exc
                        )
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


def _handle(
    msg: object,
    worker: object,
    transport: object,
    eid: int,
    configure: Callable[[Configure], None],
    drops: DropCounter,
) -> None:
    if isinstance(msg, (PrefillTask, DecodeTask)):
        worker.add(msg)  # type: ignore[attr-defined]
    elif isinstance(msg, Cancel):
        worker.cancel(msg.request_id)  # type: ignore[attr-defined]
    elif isinstance(msg, Reset):
        print(f"engine {eid}: reset by the scheduler ({msg.reason})", flush=True)
        worker.reset()  # type: ignore[attr-defined]
    elif isinstance(msg, (Peers, Welcome)):  # (a Welcome: registered again with a new scheduler)
        _set_peers(transport, msg.peers, eid)
    elif isinstance(msg, Configure):
        configure(msg)
    else:  # engine -> scheduler messages never come this way
        drops.drop("control", "unexpected", type(msg).__name__)


def standby(template: EngineArgs) -> None:
    """A warm spare engine process (``LocalCluster(standby=True)``): imports and loads the model of
    ``template`` now, then waits for the engine it is to become: one JSON line on stdin,
    ``[EngineArgs, log path]`` (same model, dtype and block size; its output goes to that log from
    then on), and runs it; an empty line or EOF ends it. A restart through a standby skips the
    process start, the imports and the model load."""
    import sys

    torch.set_num_threads(1)
    loaded = _model(template)
    print(
        f"standby (pid {os.getpid()}): {template.cluster.model} loaded; waiting for an assignment", flush=True
    )
    line = sys.stdin.readline()
    if not line.strip():
        return
    args, log = msgspec.json.decode(line.encode(), type=tuple[EngineArgs, str])
    if log:
        out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
    a, t = args.cluster, template.cluster
    same = (a.model, a.engine.dtype, a.engine.block_size) == (t.model, t.engine.dtype, t.engine.block_size)
    print(f"standby (pid {os.getpid()}): becoming engine {args.engine_id} ({args.role})", flush=True)
    run_engine(args, loaded if same else None)


def main() -> None:
    """``python -m dualpath.runtime.cluster.engine_main '<EngineArgs as JSON>'``, or
    ``... --standby '<EngineArgs as JSON>'`` (see ``standby``)."""
    import sys

    if sys.argv[1] == "--standby":
        standby(msgspec.json.decode(sys.argv[2].encode(), type=EngineArgs))
        return
    run_engine(msgspec.json.decode(sys.argv[1].encode(), type=EngineArgs))


if __name__ == "__main__":
    main()

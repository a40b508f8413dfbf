"""The heavy part of an engine process (``engine_main.py`` starts it once the heartbeat thread
runs): the model (or a standby's, loaded already), the KV pools, the block store, the transport
endpoint ``e<id>``; registration (not routable yet), the worker (its pools allocated and touched),
then ``EngineReady`` and the main loop (``engine_loop.py``). The parts are ``engine_setup.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
import zmq

from dualpath.core.units import MiB
from dualpath.runtime.cluster.config import EngineArgs
from dualpath.runtime.cluster.engine_beat import Beat, dealer
from dualpath.runtime.cluster.engine_loop import Reregister, main_loop, set_peers
from dualpath.runtime.cluster.engine_setup import (
    Loaded,
    SinkGate,
    apply_configure,
    engine_pools,
    load_model,
    make_traffic,
    sched_config,
    store_capacity,
)
from dualpath.runtime.cluster.kvio import BlockIO, Outbox
from dualpath.runtime.cluster.memory import KVPools, release_freed_memory, rss_bytes
from dualpath.runtime.cluster.messages import (
    EngineHello,
    EngineReady,
    Shutdown,
    Welcome,
    decode,
    encode,
)
from dualpath.runtime.transfer.auth import ClusterKeys
from dualpath.runtime.transfer.drops import DropCounter


def run(
    args: EngineArgs, ctx: zmq.Context, keys: ClusterKeys | None, beat: Beat, loaded: Loaded | None
) -> None:
    from dualpath.runtime.cluster.kv_backend import open_cluster_store
    from dualpath.runtime.model.packed import weights_bytes
    from dualpath.runtime.transfer.factory import make_transport

    decoder, geo, eos, vocab, max_ctx = loaded or load_model(args)
    pools = engine_pools(args.role, args.cluster.engine.kv_cache_memory, geo, max_ctx)
    sched_cfg = sched_config(args, decoder) if args.role == "prefill" else None  # before registering
    layout = geo.layout()
    store = open_cluster_store(args.cluster, layout, store_capacity(args))
    sock = dealer(ctx, args.scheduler, keys)
    traffic = make_traffic(args, max(args.engine_id, 0))
    transport = make_transport(
        args.cluster.transport, host=args.cluster.host, limiter=traffic.kv_send, keys=keys
    )
    model = (vocab, eos, max_ctx, weights_bytes(decoder))  # type: ignore[arg-type]
    hello = _hello(args, transport.address, (geo, layout), model, pools)  # type: ignore[attr-defined]
    welcome = _register(sock, hello, args)
    eid = welcome.engine_id
    if args.id_file:  # (a keeper restarts this engine under the same id)
        Path(args.id_file).write_text(str(eid))
    drops: DropCounter = transport.drops  # type: ignore[attr-defined]  # one counter per process
    drops.who = f"engine {eid} ({args.role})"
    print(f"engine {eid} ({args.role}, node {args.node_id}): data plane at {transport.address}", flush=True)  # type: ignore[attr-defined]
    gate = SinkGate()  # KV may come as soon as the scheduler knows us: hold it until the worker exists
    transport.bind(f"e{eid}", gate)
    traffic.close()
    traffic = make_traffic(args, eid)
    transport.limiter = traffic.kv_send  # type: ignore[attr-defined]
    outbox, io = Outbox(), BlockIO(store, geo, traffic)
    worker = _worker(args, eid, decoder, geo, io, transport, outbox, eos, pools, sched_cfg)
    gate.open(worker)
    set_peers(transport, welcome.peers, eid)
    release_freed_memory()
    shared = " (mapped, shared by this host's engines)" if args.weights_dir else ""
    print(f"engine {eid} ({args.role}): weights {hello.weights_bytes / MiB:.0f} MiB{shared}; "
          f"{pools.describe()}; resident {rss_bytes() / MiB:.0f} MiB", flush=True)  # fmt: skip
    beat.attach(eid, worker, io, traffic)
    sock.send(encode(EngineReady(engine_id=eid, pid=os.getpid(), rss_bytes=rss_bytes())))
    again = Reregister(beat.reregister, msgspec.structs.replace(hello, engine_id=eid, ready=True))
    try:
        main_loop(
            sock, worker, outbox, transport, eid, lambda m: apply_configure(m, worker, traffic), drops, again
        )
    finally:
        beat.close()
        io.close()
        transport.close()
        traffic.close()
        sock.close(0)


def _hello(
    args: EngineArgs,
    data_addr: str,
    geometry: tuple[Any, Any],
    model: tuple[int, int | None, int, int],
    pools: KVPools,
) -> EngineHello:
    """This engine's registration: its place, data address, model/KV geometry and memory."""
    geo, layout = geometry
    vocab, eos, max_ctx, weights = model
    return EngineHello(
        engine_id=args.engine_id,
        role=args.role,
        node_id=args.node_id,  # type: ignore[arg-type]
        data_addr=data_addr,
        pid=os.getpid(),  # type: ignore[attr-defined]
        hbm_tokens=pools.max_context_tokens if args.role == "decode" else 0,
        model_name=args.cluster.model,
        num_layers=geo.num_layers,
        kv_bytes_per_token_layer=layout.kv_bytes_per_token_layer,
        block_size=geo.block_size,
        vocab_size=vocab,
        eos_token_id=eos,
        max_context_len=max_ctx,
        ready=False,  # routable once the worker exists (EngineReady)
        generation=args.generation,
        weights_bytes=weights,
        kv_pool_bytes=pools.total_bytes,
        max_prompt_tokens=pools.max_prompt_tokens,
        max_context_tokens=pools.max_context_tokens,
    )


def _register(sock: zmq.Socket, hello: EngineHello, args: EngineArgs) -> Welcome:
    """Send the hello and wait for the scheduler's Welcome (exit with its reason on a refusal)."""
    sock.send(encode(hello))
    welcome = decode(sock.recv())
    if isinstance(welcome, Shutdown):
        raise SystemExit(f"engine ({args.role}, node {args.node_id}): the scheduler {welcome.reason}")
    assert isinstance(welcome, Welcome), welcome
    return welcome


def _worker(
    args: EngineArgs, eid: int, decoder: object, geo: object, io: BlockIO, transport: object,
    outbox: Outbox, eos: int | None, pools: KVPools, sched_cfg: object,
) -> object:  # fmt: skip
    """The engine's worker (its KV pools allocated and touched here)."""
    from dualpath.policy import make_scheduler

    common = dict(engine_id=eid, node_id=args.node_id, decoder=decoder, geo=geo, blockio=io,
                  transport=transport, outbox=outbox, pools=pools)  # fmt: skip
    if args.role == "prefill":
        from dualpath.runtime.cluster.prefill_worker import PrefillWorker

        return PrefillWorker(scheduler=make_scheduler(args.cluster.policy, sched_cfg), **common)  # type: ignore[arg-type]
    from dualpath.runtime.cluster.decode_worker import DecodeWorker

    return DecodeWorker(eos_token_id=eos, **common)  # type: ignore[arg-type]

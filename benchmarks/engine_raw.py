"""Mooncake's transfer engine alone, for ``transport_throughput.py``: the rate the ``mooncake``
transport could reach here with no dualpath code around it.

A target process registers a KV arena (``--batch`` blocks) with its engine and waits; a reader
process registers a landing buffer of the same size and READs the whole arena (one batch of
``--batch`` requests, as one dualpath message) up to ``DEPTH`` batches in flight, until ``total``
bytes moved, each batch waited with ``get_batch_transfer_status``. No copy out, no headers, no
acks: the engine's own Python API over its ``tcp`` protocol on loopback.
"""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np

DEPTH = 16  # batches in flight, as onesided.READ_DEPTH


def _engine() -> tuple[object, str]:
    from dualpath.runtime.transfer.mooncake import import_engine

    te = import_engine()()
    if te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise RuntimeError("mooncake initialize failed")
    return te, f"127.0.0.1:{te.get_rpc_port()}"


def _target(nbytes: int, q: mp.Queue, stop: mp.Event) -> None:  # type: ignore[type-arg]
    te, seg = _engine()
    arena = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    te.register_memory(arena.ctypes.data, nbytes)  # type: ignore[attr-defined]
    q.put((seg, int(arena.ctypes.data)))
    stop.wait(600)


def _reader(seg: str, remote: int, total: int, block: int, batch: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    try:
        te, _ = _engine()
        land = np.empty(block * batch * DEPTH, dtype=np.uint8)
        te.register_memory(land.ctypes.data, land.nbytes)  # type: ignore[attr-defined]
        rem = [remote + i * block for i in range(batch)]
        lens = [block] * batch

        def post(k: int) -> int:
            base = land.ctypes.data + (k % DEPTH) * block * batch
            return te.batch_transfer_async_read(seg, [base + i * block for i in range(batch)], rem, lens)  # type: ignore[attr-defined]

        te.get_batch_transfer_status([post(0)])  # type: ignore[attr-defined]  # warm-up (handshake)
        n = max(total // (block * batch), 1)
        t0 = time.perf_counter()
        flight = [post(k) for k in range(min(DEPTH, n))]
        for k in range(n):
            if te.get_batch_transfer_status([flight[k % DEPTH]]) != 0:  # type: ignore[attr-defined]
                raise RuntimeError("mooncake read failed")
            if k + DEPTH < n:
                flight[k % DEPTH] = post(k + DEPTH)
        out.put(n * batch * block / (time.perf_counter() - t0))
    except Exception as exc:  # reported by the parent, which exits non-zero
        out.put(f"{type(exc).__name__}: {exc}")


def bench_mooncake_raw(total: int, block: int, batch: int) -> float:
    """Bytes/s READ by Mooncake's engine from one process's arena into another's (see above)."""
    ctx = mp.get_context("spawn")
    q, out, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    tgt = ctx.Process(target=_target, args=(block * batch, q, stop))
    tgt.start()
    try:
        seg, remote = q.get(timeout=60)
        rd = ctx.Process(target=_reader, args=(seg, remote, total, block, batch, out))
        rd.start()
        got = out.get(timeout=600)
        rd.join(30)
    finally:
        stop.set()
        tgt.join(30)
    if isinstance(got, str):
        raise RuntimeError(f"mooncake_raw: {got}")
    return got

"""Throughput of the cross-process KV transports against raw loopback TCP and memcpy, in one run.

Each transport moves ``--total-mb`` of Layer Blocks (``--block-kb`` each, ``--batch`` per submit,
the way a prefill engine streams one layer of several blocks) from one transport to another, each
in its own process, and waits for every completion (delivered into the receiver's sink, which
copies the bytes out as the contract requires). Baselines measured in the same run: a raw loopback
TCP socket between two processes (sendall/recv_into, no framing, no copy out) and numpy memcpy of
the same block size. Prints GB/s and ratios.

    .venv/bin/python benchmarks/transport_throughput.py [--total-mb 512] [--block-kb 96] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import time
from collections.abc import Sequence

import numpy as np


class _CopySink:
    def __init__(self, nbytes: int) -> None:
        self.buf = np.empty(nbytes, dtype=np.uint8)

    def deliver(self, source: str, items: Sequence[object]) -> None:
        for it in items:
            mv = memoryview(it.payload).cast("B")  # type: ignore[attr-defined]
            self.buf[: mv.nbytes] = np.frombuffer(mv, dtype=np.uint8)


def _receiver(kind: str, block: int, q: mp.Queue, stop: mp.Event) -> None:  # type: ignore[type-arg]
    from dualpath.runtime.transfer.factory import make_transport

    t = make_transport(kind)
    t.bind("rx", _CopySink(block))
    q.put(t.address)  # type: ignore[attr-defined]
    stop.wait(600)
    t.close()


def bench_transport(kind: str, total: int, block: int, batch: int) -> float:
    from dualpath.runtime.transfer.base import TransferItem
    from dualpath.runtime.transfer.factory import make_transport

    ctx = mp.get_context("spawn")
    q, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_receiver, args=(kind, block, q, stop))
    proc.start()
    tx = make_transport(kind)
    tx.add_route("rx", q.get(timeout=60))  # type: ignore[attr-defined]
    payload = np.random.default_rng(0).integers(0, 255, block, dtype=np.uint8)
    items = [
        TransferItem(key="r", block_index=i, layer=0, num_tokens=64, payload=payload) for i in range(batch)
    ]
    tx.submit("rx", items).wait(30)  # warm-up (connections, first-touch)
    n = max(total // (block * batch), 1)
    t0 = time.perf_counter()
    handles = [tx.submit("rx", items) for _ in range(n)]
    for h in handles:
        h.wait(120)
    dt = time.perf_counter() - t0
    tx.close()
    stop.set()
    proc.join(30)
    return n * batch * block / dt


def _tcp_sink(port_q: mp.Queue, total: int, block: int) -> None:  # type: ignore[type-arg]
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port_q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    buf = bytearray(block)
    got = 0
    while got < total:
        k = conn.recv_into(buf)
        if k == 0:
            break
        got += k
    conn.sendall(b"k")
    conn.close()
    srv.close()


def bench_tcp(total: int, block: int) -> float:
    n = max(total // block, 1)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_tcp_sink, args=(q, n * block, block))
    proc.start()
    s = socket.create_connection(("127.0.0.1", q.get(timeout=60)))
    payload = bytes(block)
    t0 = time.perf_counter()
    for _ in range(n):
        s.sendall(payload)
    s.recv(1)
    dt = time.perf_counter() - t0
    s.close()
    proc.join(30)
    return n * block / dt


MEMCPY_ARENA = 256 << 20  # memcpy reads blocks from this much memory: DRAM, not a cached block


def bench_memcpy(total: int, block: int) -> float:
    """Copy ``total`` bytes block by block into one sink block (as the transports' sink does),
    reading the blocks from a 256 MiB arena so the source comes from DRAM."""
    per_arena = max(MEMCPY_ARENA // block, 1)
    src = np.random.default_rng(0).integers(0, 255, per_arena * block, dtype=np.uint8)
    dst = np.empty(block, dtype=np.uint8)
    n = max(total // block, 1)
    t0 = time.perf_counter()
    for i in range(n):
        k = (i % per_arena) * block
        np.copyto(dst, src[k : k + block])
    return n * block / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--total-mb", type=float, default=512)
    ap.add_argument("--block-kb", type=float, default=96, help="SmolLM2 fp32 Layer Block = 96 KiB")
    ap.add_argument("--batch", type=int, default=8, help="Layer Blocks per submit")
    ap.add_argument("--transports", default="zmq,shm")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    total, block = int(args.total_mb * 2**20), int(args.block_kb * 1024)
    res = {"memcpy": bench_memcpy(total, block), "tcp_loopback": bench_tcp(total, block)}
    for kind in args.transports.split(","):
        res[kind] = bench_transport(kind, total, block, args.batch)
    ratios = {f"{k}_over_tcp": res[k] / res["tcp_loopback"] for k in args.transports.split(",")}
    ratios |= {f"{k}_over_memcpy": res[k] / res["memcpy"] for k in args.transports.split(",")}
    if args.json:
        print(
            json.dumps(
                {
                    "gb_per_s": {k: v / 1e9 for k, v in res.items()},
                    "ratios": ratios,
                    "block_bytes": block,
                    "batch": args.batch,
                },
                indent=2,
            )
        )
        return
    print(f"block {block} B, {args.batch} blocks per submit, {args.total_mb} MiB per run")
    for k, v in res.items():
        print(f"  {k:13s} {v / 1e9:7.3f} GB/s")
    for k, v in ratios.items():
        print(f"  {k:20s} {v:6.2f}")


if __name__ == "__main__":
    main()

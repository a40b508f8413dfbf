"""Throughput of the cross-process KV transports against the raw path each rides on, in one run.

Each transport moves ``--total-mb`` of Layer Blocks (``--block-kb`` each, ``--batch`` per submit,
the way a prefill engine streams one layer of several blocks) from one transport to another, each
in its own process, and waits for every completion (delivered into the receiver's sink, which
copies the bytes out as the contract requires). Baselines measured in the same run: a raw loopback
TCP socket between two processes (sendall/recv_into, no framing, no copy out) and numpy memcpy of
the same block size from a 256 MiB arena. The sender's blocks are ``--batch`` adjacent blocks of
one KV buffer, which the one-sided engines (mooncake, nixl) register once (``register``) and send
in place. Each transport is compared with the raw path it rides on
(``RAW_PATH``): zmq, mooncake (its ``tcp`` protocol) and nixl-tcp (UCX_TLS=tcp) with TCP; shm and
nixl-cma (UCX_TLS=cma,tcp: cross-memory attach) with memcpy. ``--repeat`` runs of everything,
interleaved; medians printed. A transport whose engine does not import is left out with the reason
(named in ``--transports``: an error); a run that fails exits non-zero. With mooncake, its engine
alone (``engine_raw.py``: the same READs through Mooncake's own API, no dualpath code) is measured
too, and printed as the engine over TCP and the transport over the engine.

    .venv/bin/python benchmarks/transport_throughput.py [--total-mb 512] [--block-kb 96] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np
from engine_raw import bench_mooncake_raw

RAW_PATH = {"zmq": "tcp", "mooncake": "tcp", "nixl-tcp": "tcp", "shm": "memcpy", "nixl-cma": "memcpy"}
VARIANT_ENV = {"nixl-tcp": {"UCX_TLS": "tcp"}, "nixl-cma": {"UCX_TLS": "cma,tcp"}}  # UCX reads it at start
TRANSPORTS = tuple(RAW_PATH)


def _factory_name(kind: str) -> str:
    return kind.split("-")[0]


class _CopySink:
    def __init__(self, nbytes: int) -> None:
        self.buf = np.empty(nbytes, dtype=np.uint8)

    def deliver(self, source: str, items: Sequence[object]) -> None:
        for it in items:
            mv = memoryview(it.payload).cast("B")  # type: ignore[attr-defined]
            self.buf[: mv.nbytes] = np.frombuffer(mv, dtype=np.uint8)


def _receiver(kind: str, block: int, q: mp.Queue, stop: mp.Event) -> None:  # type: ignore[type-arg]
    os.environ.update(VARIANT_ENV.get(kind, {}))
    from dualpath.runtime.transfer.factory import make_transport

    t = make_transport(_factory_name(kind))
    t.bind("rx", _CopySink(block))
    q.put(t.address)  # type: ignore[attr-defined]
    stop.wait(600)
    t.close()


def _sender(kind: str, addr: str, total: int, block: int, batch: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    os.environ.update(VARIANT_ENV.get(kind, {}))
    from dualpath.runtime.transfer.base import TransferItem
    from dualpath.runtime.transfer.factory import make_transport

    try:
        tx = make_transport(_factory_name(kind))
        tx.add_route("rx", addr)  # type: ignore[attr-defined]
        arena = np.random.default_rng(0).integers(0, 255, block * batch, dtype=np.uint8)
        tx.register(arena)  # one-sided engines: the KV buffer registered once, sent in place
        items = [
            TransferItem(
                key="r", block_index=i, layer=0, num_tokens=64, payload=arena[i * block : (i + 1) * block]
            )
            for i in range(batch)
        ]
        tx.submit("rx", items).wait(30)  # warm-up (connections, handshakes, first-touch)
        n = max(total // (block * batch), 1)
        t0 = time.perf_counter()
        handles = [tx.submit("rx", items) for _ in range(n)]
        for h in handles:
            h.wait(120)
        out.put(n * batch * block / (time.perf_counter() - t0))
        tx.close()
    except Exception as exc:  # reported by the parent, which exits non-zero
        out.put(f"{type(exc).__name__}: {exc}")


def bench_transport(kind: str, total: int, block: int, batch: int) -> float:
    """Bytes/s from a sender process to a receiver process through transport ``kind``."""
    ctx = mp.get_context("spawn")
    q, out, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    rx = ctx.Process(target=_receiver, args=(kind, block, q, stop))
    rx.start()
    try:
        tx = ctx.Process(target=_sender, args=(kind, q.get(timeout=60), total, block, batch, out))
        tx.start()
        got = out.get(timeout=600)
        tx.join(30)
    finally:
        stop.set()
        rx.join(30)
    if isinstance(got, str):
        raise RuntimeError(f"transport {kind}: {got}")
    return got


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


def available(kinds: Sequence[str], explicit: bool) -> tuple[list[str], dict[str, str]]:
    """The kinds whose engine imports here, and why each other one does not (named: exit 2)."""
    from dualpath.runtime.transfer.factory import missing

    run, skipped = [], {}
    for kind in kinds:
        if kind not in RAW_PATH:
            sys.exit(f"unknown transport {kind!r}; choices: {', '.join(TRANSPORTS)}")
        why = missing(_factory_name(kind))
        if why is None:
            run.append(kind)
        elif explicit:
            sys.exit(f"transport {kind}: {why}")
        else:
            skipped[kind] = why
    return run, skipped


def measure(kinds: Sequence[str], total: int, block: int, batch: int, repeat: int) -> dict[str, list[float]]:
    """Bytes/s of every baseline and transport, ``repeat`` interleaved runs each (with mooncake:
    its engine alone too, ``engine_raw.py``, to trace the transport's cost over the engine)."""
    raw = ["mooncake_raw"] if "mooncake" in kinds else []
    runs: dict[str, list[float]] = {"memcpy": [], "tcp": [], **{k: [] for k in raw + list(kinds)}}
    for r in range(repeat):
        runs["memcpy"].append(bench_memcpy(total, block))
        runs["tcp"].append(bench_tcp(total, block))
        if raw:
            runs["mooncake_raw"].append(bench_mooncake_raw(total, block, batch))
        for kind in kinds:
            runs[kind].append(bench_transport(kind, total, block, batch))
        print(f"run {r + 1}/{repeat} done", file=sys.stderr, flush=True)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--total-mb", type=float, default=512)
    ap.add_argument("--block-kb", type=float, default=96, help="SmolLM2 fp32 Layer Block = 96 KiB")
    ap.add_argument("--batch", type=int, default=8, help="Layer Blocks per submit")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs of everything (medians)")
    ap.add_argument(
        "--transports",
        default="",
        help=f"comma-separated (default: those of {', '.join(TRANSPORTS)} that import)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    total, block = int(args.total_mb * 2**20), int(args.block_kb * 1024)
    names = [k.strip() for k in args.transports.split(",") if k.strip()] or list(TRANSPORTS)
    kinds, skipped = available(names, explicit=bool(args.transports))
    runs = measure(kinds, total, block, args.batch, args.repeat)
    med = {k: statistics.median(v) for k, v in runs.items()}
    ratios = {f"{k}_over_{RAW_PATH[k]}": med[k] / med[RAW_PATH[k]] for k in kinds}
    if "mooncake_raw" in med:  # the trace: the engine alone over TCP, the transport over the engine
        ratios["mooncake_raw_over_tcp"] = med["mooncake_raw"] / med["tcp"]
        ratios["mooncake_over_mooncake_raw"] = med["mooncake"] / med["mooncake_raw"]
    if args.json:
        print(json.dumps({"gb_per_s": {k: v / 1e9 for k, v in med.items()},
                          "runs_gb_per_s": {k: [x / 1e9 for x in v] for k, v in runs.items()},
                          "ratios": ratios, "raw_path": {k: RAW_PATH[k] for k in kinds}, "skipped": skipped,
                          "block_bytes": block, "batch": args.batch, "repeat": args.repeat}, indent=2))  # fmt: skip
        return
    print(
        f"block {block} B, {args.batch} blocks per submit, {args.total_mb} MiB per run, median of {args.repeat}"
    )
    for k, v in med.items():
        print(
            f"  {k:12s} {v / 1e9:7.3f} GB/s"
            + (f"   {ratios[f'{k}_over_{RAW_PATH[k]}']:.2f}x {RAW_PATH[k]}" if k in RAW_PATH else "")
        )
    if "mooncake_raw" in med:
        print(
            f"  mooncake engine alone {ratios['mooncake_raw_over_tcp']:.2f}x tcp;"
            f" the mooncake transport {ratios['mooncake_over_mooncake_raw']:.2f}x the engine alone"
        )
    for k, why in skipped.items():
        print(f"  {k:10s} not run: {why}")


if __name__ == "__main__":
    main()

"""A compute-NIC cap by the kernel (tc tbf on a veth between two network namespaces) against the
in-process emulation (``traffic.Link`` as the engines' ``kv_send`` limiter), in one run.

Two namespaces from ``deploy/netns/netns.sh`` (root needed); a zmq KV transport in each, the one
in host 0 sending ``--total-mb`` of Layer Blocks (``--block-kb`` each, ``--batch`` per submit)
to the one in host 1, which copies them out (the contract's sink). Legs, interleaved over
``--repeat`` rounds: the veth uncapped (the link's own rate, the baseline), the veth capped by tc
at ``--cap-mbit``, and the veth uncapped with the emulated cap on the sender. Printed: each leg's
median rate, and each capped leg's rate over the cap (1.0 = the cap exactly) and over the
uncapped link. A leg that fails exits non-zero.

    python benchmarks/netns_cnic.py [--cap-mbit 100] [--total-mb 64] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "deploy" / "netns" / "netns.sh"
LEGS = ("uncapped", "tc", "emulated")


def _receiver(host: str, block: int) -> None:
    """(in host 1) bind, print the address, copy out what arrives until stdin closes."""
    import numpy as np

    from dualpath.runtime.transfer.factory import make_transport

    buf = np.empty(block, dtype=np.uint8)

    class Sink:
        def deliver(self, source: str, items: list) -> None:  # type: ignore[type-arg]
            for it in items:
                mv = memoryview(it.payload).cast("B")
                buf[: mv.nbytes] = np.frombuffer(mv, dtype=np.uint8)

    t = make_transport("zmq", host=host)
    t.bind("rx", Sink())
    print(t.address, flush=True)  # type: ignore[attr-defined]
    sys.stdin.read()
    t.close()


def _sender(host: str, addr: str, total: int, block: int, batch: int, cap_mbit: float) -> None:
    """(in host 0) send, print bytes/s; ``cap_mbit`` > 0: through an emulated CNIC of that rate."""
    import numpy as np

    from dualpath.runtime.cluster.traffic import Link
    from dualpath.runtime.transfer.base import TransferItem
    from dualpath.runtime.transfer.factory import make_transport

    link = Link("bench/cnic", cap_mbit * 125_000, None) if cap_mbit > 0 else None
    limiter = (lambda n: link.transmit(n, "kv")) if link else None
    tx = make_transport("zmq", host=host, limiter=limiter)
    tx.add_route("rx", addr)  # type: ignore[attr-defined]
    payload = np.random.default_rng(0).integers(0, 255, block, dtype=np.uint8)
    items = [
        TransferItem(key="r", block_index=i, layer=0, num_tokens=64, payload=payload) for i in range(batch)
    ]
    tx.submit("rx", items).wait(60)  # warm-up: the connection
    n = max(total // (block * batch), 1)
    t0 = time.perf_counter()
    for h in [tx.submit("rx", items) for _ in range(n)]:
        h.wait(600)
    print(n * batch * block / (time.perf_counter() - t0), flush=True)
    tx.close()


def _in_ns(ns: str, *argv: str, **kw: object) -> subprocess.Popen[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = ["ip", "netns", "exec", ns, sys.executable, __file__, *argv]
    return subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE, **kw)  # type: ignore[call-overload]


def one_leg(name: str, subnet: str, leg: str, args: argparse.Namespace) -> float:
    rx = _in_ns(f"{name}-1", "--role", "rx", "--host", f"{subnet}.3", "--block-kb", str(args.block_kb),
                stdin=subprocess.PIPE)  # fmt: skip
    try:
        addr = rx.stdout.readline().strip()  # type: ignore[union-attr]
        if not addr:
            raise RuntimeError("the receiver did not start")
        emulated = str(args.cap_mbit) if leg == "emulated" else "0"
        tx = _in_ns(f"{name}-0", "--role", "tx", "--host", f"{subnet}.2", "--addr", addr,
                    "--total-mb", str(args.total_mb), "--block-kb", str(args.block_kb),
                    "--batch", str(args.batch), "--emulate-mbit", emulated)  # fmt: skip
        out, _ = tx.communicate(timeout=900)
        if tx.returncode != 0 or not out.strip():
            raise RuntimeError(f"leg {leg}: the sender failed (exit {tx.returncode})")
        return float(out.strip().splitlines()[-1])
    finally:
        rx.communicate("", timeout=60)


def _script(*argv: str) -> str:
    done = subprocess.run(["bash", str(SCRIPT), *argv], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"netns.sh {' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout.strip()


def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    name, subnet = f"dpb{os.getpid() % 10000}", f"10.232.{os.getpid() % 250}"
    rates: dict[str, list[float]] = {leg: [] for leg in LEGS}
    _script("down", name, "2")
    try:
        _script("up", name, "2", "--subnet", subnet)
        for r in range(args.repeat):
            for leg in LEGS[r % 3 :] + LEGS[: r % 3]:  # (the order rotates: load changes hit every leg)
                if leg == "tc" and _script("cap", name, "2", str(args.cap_mbit)) != "tc":
                    raise RuntimeError("tc refused a tbf qdisc here: no kernel cap to measure")
                try:
                    rates[leg].append(one_leg(name, subnet, leg, args))
                finally:
                    _script("uncap", name, "2")
                print(f"round {r + 1}/{args.repeat} {leg}: {rates[leg][-1] / 1e6:.1f} MB/s", file=sys.stderr)
    finally:
        _script("down", name, "2")
    return rates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cap-mbit", type=int, default=100)
    p.add_argument("--total-mb", type=int, default=64)
    p.add_argument("--block-kb", type=int, default=96)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--role", choices=("rx", "tx"), help=argparse.SUPPRESS)
    p.add_argument("--host", help=argparse.SUPPRESS)
    p.add_argument("--addr", help=argparse.SUPPRESS)
    p.add_argument("--emulate-mbit", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "rx":
        return _receiver(args.host, args.block_kb * 1024)
    if args.role == "tx":
        return _sender(args.host, args.addr, args.total_mb * 2**20, args.block_kb * 1024, args.batch,
                       args.emulate_mbit)  # fmt: skip
    for key in ("cap_mbit", "total_mb", "block_kb", "batch", "repeat"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if os.geteuid() != 0:
        p.error("network namespaces need root")
    try:
        rates = measure(args)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    cap = args.cap_mbit * 125_000
    med = {leg: statistics.median(v) for leg, v in rates.items()}
    result = {
        "cap_mbit": args.cap_mbit,
        "median_bytes_per_s": med,
        "runs_bytes_per_s": rates,
        "tc_over_cap": med["tc"] / cap,
        "emulated_over_cap": med["emulated"] / cap,
        "uncapped_over_cap": med["uncapped"] / cap,
        "load_average": os.getloadavg()[0],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"cap {args.cap_mbit} Mbit/s ({cap / 1e6:.1f} MB/s), {args.total_mb} MB of {args.block_kb} KiB blocks "
          f"x {args.batch}, median of {args.repeat}; load average {result['load_average']:.1f}")  # fmt: skip
    for leg in LEGS:
        print(f"  {leg:9s} {med[leg] / 1e6:8.1f} MB/s  {med[leg] / cap:5.2f} x cap  "
              f"{med[leg] / med['uncapped']:5.2f} x uncapped")  # fmt: skip


if __name__ == "__main__":
    main()

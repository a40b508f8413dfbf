"""Cost of CURVE authentication (and encryption) on the zmq KV transport, against the plain
transport measured in the same run.

Two ZmqTransports in one process (the receive side copies each payload out, as the sink contract
requires) move ``--total-mb`` of Layer Blocks (``--block-kb`` each, ``--batch`` per submit), plain
and then with a cluster keypair (``runtime/transfer/auth.py``); prints GB/s and the ratio.

    .venv/bin/python benchmarks/transport_auth.py [--total-mb 256] [--block-kb 96] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from transport_throughput import _CopySink  # same folder: the receive side copies out


def run(total: int, block: int, batch: int, keyed: bool) -> float:
    from dualpath.runtime.transfer.auth import ClusterKeys
    from dualpath.runtime.transfer.base import TransferItem
    from dualpath.runtime.transfer.zmq_transport import ZmqTransport

    keys = ClusterKeys.generate() if keyed else None
    rx, tx = ZmqTransport(keys=keys), ZmqTransport(keys=keys)
    try:
        rx.bind("rx", _CopySink(block))
        tx.add_route("rx", rx.address)
        payload = np.random.default_rng(0).integers(0, 255, block, dtype=np.uint8)
        items = [
            TransferItem(key="r", block_index=i, layer=0, num_tokens=64, payload=payload)
            for i in range(batch)
        ]
        tx.submit("rx", items).wait(30)  # warm-up: connections, handshakes
        n = max(total // (block * batch), 1)
        t0 = time.perf_counter()
        handles = [tx.submit("rx", items) for _ in range(n)]
        for h in handles:
            h.wait(120)
        return n * batch * block / (time.perf_counter() - t0) / 1e9
    finally:
        tx.close()
        rx.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total-mb", type=int, default=256)
    ap.add_argument("--block-kb", type=int, default=96)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    total, block = a.total_mb << 20, a.block_kb << 10
    plain = run(total, block, a.batch, keyed=False)
    curve = run(total, block, a.batch, keyed=True)
    out = {
        "plain_gbps": round(plain, 3),
        "curve_gbps": round(curve, 3),
        "curve_over_plain": round(curve / plain, 3),
    }
    if a.json:
        print(json.dumps(out))
    else:
        print(f"zmq transport plain {plain:.3f} GB/s, CURVE {curve:.3f} GB/s: ratio {curve / plain:.2f}")


if __name__ == "__main__":
    main()

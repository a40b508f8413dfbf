"""Cost of one Layer Block hand-off (submit + complete) on the transfer interface.

Spec section 5: layerwise prefill multiplies the number of transfers by n_layer, so per-transfer cost
matters (RDMA submit ~1 us, cudaMemcpyAsync ~5-7 us). Goal: well under 50 us per Layer Block with
batching. Measured here on the in-process transport into a real DE buffer (KVBuffer sink, which copies
the bytes) and into a null sink (interface cost only), against a plain torch copy of the same bytes
(the physical floor, measured in the same run). Geometry: SmolLM2-135M (30 layers, 3 KV heads x 64,
bf16 KV: 768 B per token per layer), 64-token blocks (48 KiB Layer Blocks), a 4,096-token request.

Run: .venv/bin/python benchmarks/transfer_overhead.py [--tokens 4096] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from dualpath.runtime.engine import KVBuffer, KVGeometry
from dualpath.runtime.transfer import InProcFabric, TransferItem


class NullSink:
    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        pass


def _time(fn: Callable[[], None], repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    geo = KVGeometry(num_layers=30, num_kv_heads=3, head_dim=64, dtype=torch.bfloat16, block_size=64)
    nblocks, layers = geo.num_blocks(args.tokens), geo.num_layers
    src = KVBuffer(geo, nblocks * geo.full_block_bytes, name="src")
    src.allocate("r", args.tokens)
    fabric = InProcFabric()
    dst = KVBuffer(geo, nblocks * geo.full_block_bytes, name="de0")
    dst.allocate("r", args.tokens)
    results: dict[str, float] = {}
    for mode in ("sync", "async"):
        tx = fabric.transport(asynchronous=mode == "async")
        for sink_name, sink in (("de-buffer", dst), ("null", NullSink())):
            ep = f"{sink_name}-{mode}"
            tx.bind(ep, sink)

            def unbatched(ep: str = ep, tx=tx) -> None:  # type: ignore[no-untyped-def]
                # item construction (slicing the block views) is part of the hand-off cost
                items = [it for layer in range(layers) for it in src.layer_items("r", layer, 0, args.tokens)]
                handles = [tx.submit(ep, [it]) for it in items]
                for h in handles:
                    h.wait(10.0)

            def batched(ep: str = ep, tx=tx) -> None:  # type: ignore[no-untyped-def]
                handles = [
                    tx.submit(ep, src.layer_items("r", layer, 0, args.tokens)) for layer in range(layers)
                ]  # one submit per layer
                for h in handles:
                    h.wait(10.0)

            results[f"{ep}/unbatched"] = _time(unbatched, args.repeats)
            results[f"{ep}/batched"] = _time(batched, args.repeats)
        tx.close()
    # physical floor: copy the same bytes with torch, layer block by layer block
    a, b = src.blocks("r").tensors, dst.blocks("r").tensors

    def memcpy() -> None:
        for layer in range(layers):
            for j in range(nblocks):
                b[j][layer].copy_(a[j][layer])

    results["memcpy"] = _time(memcpy, args.repeats)
    n = nblocks * layers
    floor_us = results["memcpy"] / n * 1e6
    print(
        f"request: {args.tokens} tokens = {nblocks} blocks x {layers} layers = {n} Layer Blocks "
        f"of {geo.layout.layer_block_bytes} B"
    )
    print(f"{'case':32s} {'us/LayerBlock':>14s} {'us/layer':>10s} {'ms/request':>11s} {'overhead us':>12s}")
    print(
        f"{'torch copy (floor)':32s} {floor_us:14.2f} {results['memcpy'] / layers * 1e6:10.1f} "
        f"{results['memcpy'] * 1e3:11.2f} {0.0:12.2f}"
    )
    for key, total in results.items():
        if key == "memcpy":
            continue
        per_block = total / n * 1e6
        over = per_block - (floor_us if key.startswith("de-buffer") else 0.0)
        print(f"{key:32s} {per_block:14.2f} {total / layers * 1e6:10.1f} {total * 1e3:11.2f} {over:12.2f}")
    best = results["de-buffer-sync/batched"] / n * 1e6
    print(
        f"ratio batched hand-off / 50 us goal: {best / 50:.3f}; "
        f"batched / torch-copy floor: {results['de-buffer-sync/batched'] / results['memcpy']:.2f}x"
    )


if __name__ == "__main__":
    main()

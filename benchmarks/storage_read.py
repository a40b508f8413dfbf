"""Full Block read throughput of the KV block store versus fio sequential reads of the same files.

For each block geometry (SmolLM2-135M: 1.47 MB Full Blocks; Qwen2.5-32B: 16.8 MB) it writes
``--data-mb`` of blocks with BlockStore, then alternates, ``--reps`` times, cold (page cache dropped
with ``echo 1 > /proc/sys/vm/drop_caches``, or per-file fadvise DONTNEED when that is not allowed)
and warm runs of:

- store: IOEngine(queue_depth=Q) reading every block into pooled buffers, request by request
         (crc32 verified, and not);
- fio:   sequential psync reads of the same files, one read per file (bs = file size), Q jobs over
         disjoint file sets and 1 job. The better of the two is the baseline;

and O_DIRECT runs (``BlockStore(direct_io=True)`` versus fio ``direct=1``). Throughput counts whole
file bytes for both. The storage backends (docs/kvstore.md) join where their packages import:

- store_nixl (``--kv-backend nixl-posix``): the same files read through NIXL's POSIX plugin, in the
  cold, warm and O_DIRECT runs, against the same fio baseline;
- memory mode (``--kv-backend mooncake``): the blocks put into a Mooncake Store started for the run
  (master + a holder of the data, tcp on loopback; at most ``--mooncake-mb``), read by the store
  (store_mooncake) against, in the same reps, raw ``get_into`` calls of the same objects with no
  dualpath code (mooncake_raw: the path it rides on) and numpy memcpy of the same bytes (memcpy,
  Q threads and 1), each with Q threads. Ratios are printed against every baseline.
 Prints best-of-reps GB/s (the machine is shared; medians are in --json), CPU
seconds per GB, and store / best-fio ratios per mode, best against best and the median of the
per-rep ratios (goal >= 0.85). Without fio the baseline is a
plain Python sequential read.

    .venv/bin/python benchmarks/storage_read.py [--data-mb 1024] [--queue-depth 4] [--reps 3] [--json]
        [--backends posix,nixl-posix,mooncake] [--mooncake-mb 256]

A backend that cannot run here is left out and said so (``skipped`` in --json, with the reason).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np
from storage_backends import mooncake_runs, nixl_store

from dualpath.runtime.kvstore import (
    BlockLayout,
    BlockStore,
    BufferPool,
    IOEngine,
    IOEngineConfig,
    block_hash,
)
from dualpath.runtime.kvstore.backends import missing
from dualpath.runtime.kvstore.blockfile import file_bytes_for
from dualpath.runtime.kvstore.files import block_path

CASES = {  # name -> (num_layers, kv_bytes_per_token_layer), as in dualpath.spec.models
    "smollm2-135m": (30, 768),  # 3 KV heads x 64 dim x (K, V) x bf16
    "qwen2.5-32b": (64, 4096),  # 8 KV heads x 128 dim x (K, V) x bf16
}


def drop_caches(files: list[Path]) -> str:
    """Empty the page cache of ``files``; returns the method used.

    Drops file data only (``echo 1``), keeping inodes and dentries cached: fio opens and stats its
    files before its timed phase, the store opens each file inside it, so dropping metadata too
    would charge the store alone for the inode reads.
    """
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return "drop_caches"
    except OSError:
        for p in files:
            fd = os.open(p, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        return "fadvise"


def populate(root: Path, layout: BlockLayout, data_mb: int) -> list[str]:
    """Write ~data_mb of Full Blocks (chains of 16 blocks) and return their hashes."""
    store = BlockStore(root, layout)
    rng = np.random.default_rng(0)
    payloads = [rng.integers(0, 256, layout.full_block_bytes, dtype=np.uint8) for _ in range(4)]
    num_blocks = max(8, data_mb * 2**20 // layout.full_block_bytes)
    hashes: list[str] = []
    bs = layout.block_size
    for chain in range(-(-num_blocks // 16)):
        toks = np.arange(16 * bs) + chain * 1_000_000
        parent = None
        for i in range(min(16, num_blocks - len(hashes))):
            h = block_hash(parent, toks[i * bs : (i + 1) * bs])
            store.write_full(h, parent, toks[i * bs : (i + 1) * bs], payloads[len(hashes) % 4])
            hashes.append(h)
            parent = h
    os.sync()
    return hashes


def store_read_gbs(store: BlockStore, hashes: list[str], qd: int, per_request: int) -> float:
    """GB/s of file bytes reading every block once through an IOEngine, as a PE would: requests
    of ``per_request`` blocks, enough requests in flight to keep ``2 * qd`` blocks queued (at least
    two), buffers reused from a pool sized for them."""
    layout = store.layout
    depth = max(2, -(-2 * qd // per_request))
    pool = BufferPool(layout.full_block_bytes, depth * per_request)
    requests = [hashes[i : i + per_request] for i in range(0, len(hashes), per_request)]
    failures = 0
    with IOEngine(store, IOEngineConfig(queue_depth=qd), pool=pool) as eng:
        start = time.perf_counter()
        pending = deque(eng.submit_blocks(req) for req in requests[:depth])
        for nxt in requests[depth:] + [None] * depth:
            for fut in pending.popleft():
                r = fut.result()
                failures += not r.ok
                r.release()
            if nxt is not None:
                pending.append(eng.submit_blocks(nxt))
        elapsed = time.perf_counter() - start
    if failures:
        raise RuntimeError(f"{failures} blocks failed to read")
    return len(hashes) * file_bytes_for(layout) / elapsed / 1e9


def fio_read_gbs(
    files: list[Path], num_jobs: int, workdir: Path, file_bytes: int, direct: bool = False
) -> float:
    """GB/s of fio sequential psync reads over ``files`` split among ``num_jobs`` jobs.

    The read size is one whole block file (as the store reads): fio skips a file's tail shorter
    than ``bs``, so a 1 MiB ``bs`` would read only 1 MiB of a 1.47 MB block.
    Each job reads a directory of hard links to its share of the block files (same inodes, so the
    same data and page cache); fio limits option values to 4 KiB, too short for file lists.
    """
    lines = ["[global]", "rw=read", f"bs={file_bytes}", "ioengine=psync", "invalidate=0",
             "file_service_type=sequential", "group_reporting=1", f"direct={int(direct)}"]  # fmt: skip
    for j in range(num_jobs):
        view = workdir / f"fio-view-{num_jobs}-{j}"
        if not view.exists():
            view.mkdir()
            for p in files[j::num_jobs]:
                os.link(p, view / p.name)
        lines += [f"[job{j}]", f"opendir={view}"]
    jobfile = workdir / f"read-{num_jobs}-{int(direct)}.fio"
    jobfile.write_text("\n".join(lines) + "\n")
    out = subprocess.run(
        ["fio", "--output-format=json", str(jobfile)], capture_output=True, text=True, check=True
    )
    read = json.loads(out.stdout[out.stdout.index("{") :])["jobs"][0]["read"]
    return read["io_bytes"] / (read["runtime"] / 1e3) / 1e9


def python_read_gbs(files: list[Path]) -> float:
    """GB/s of a plain sequential read of every file (fallback baseline without fio)."""
    buf = bytearray(2**20)
    total, start = 0, time.perf_counter()
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total / (time.perf_counter() - start) / 1e9


def _timed(fn: Callable[[], float]) -> tuple[float, float]:
    """(GB/s, CPU seconds of this process and its children) of one measurement."""
    before = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    gbs = fn()
    after = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(a.ru_utime + a.ru_stime - b.ru_utime - b.ru_stime for a, b in zip(after, before))
    return gbs, cpu


def _summary(per: dict[str, list[tuple[float, float]]], gb: float) -> dict[str, object]:
    """Best-of-reps rates and ratios, plus the median over reps of the ratio within each rep
    (store run / best fio run of the same rep), which cancels slow drifts in machine load."""
    best = {k: max(g for g, _ in v) for k, v in per.items()}  # best of reps: least disturbed
    fio_keys = [k for k in per if not k.startswith("store")]
    baseline = max(best[k] for k in fio_keys)
    num_reps = len(next(iter(per.values())))
    paired = {
        k: statistics.median(v[i][0] / max(per[f][i][0] for f in fio_keys) for i in range(num_reps))
        for k, v in per.items()
        if k.startswith("store")
    }
    return {
        "gbs_best": best,
        "gbs_median": {k: statistics.median(g for g, _ in v) for k, v in per.items()},
        "cpu_s_per_gb": {k: statistics.median(c for _, c in v) / gb for k, v in per.items()},
        "ratio": {k: v / baseline for k, v in best.items() if k.startswith("store")},
        "ratio_paired_median": paired,
        "ratio_vs": {f"{k}/{f}": best[k] / best[f] for k in best if k.startswith("store") for f in fio_keys},
    }


def run_case(name: str, args: argparse.Namespace, base: Path) -> dict[str, object]:
    layers, kvb = CASES[name]
    layout = BlockLayout(num_layers=layers, kv_bytes_per_token_layer=kvb)
    root = base / name
    hashes = populate(root, layout, args.data_mb)
    files = [block_path(root, h) for h in hashes]
    qd, fb = args.queue_depth, file_bytes_for(layout)
    per_req = max(1, min(args.blocks_per_request, 64 * 2**20 // layout.full_block_bytes))
    # opened once, before any cache drop: the timed reads include each file's header
    checked, unchecked = BlockStore(root, layout), BlockStore(root, layout, verify=False)
    direct = BlockStore(root, layout, direct_io=True)
    buffered: dict[str, Callable[[], float]] = {
        "store": lambda: store_read_gbs(checked, hashes, qd, per_req),
        "store_nocrc": lambda: store_read_gbs(unchecked, hashes, qd, per_req),
    }
    direct_io: dict[str, Callable[[], float]] = {
        "store_direct": lambda: store_read_gbs(direct, hashes, qd, per_req)
    }
    if "nixl-posix" in args.backends and not missing("nixl-posix"):
        nixl, nixl_direct = nixl_store(root, layout), nixl_store(root, layout, direct_io=True)
        buffered["store_nixl"] = lambda: store_read_gbs(nixl, hashes, qd, per_req)
        direct_io["store_nixl_direct"] = lambda: store_read_gbs(nixl_direct, hashes, qd, per_req)
    if shutil.which("fio"):
        buffered[f"fio_{qd}jobs"] = lambda: fio_read_gbs(files, qd, base, fb)
        buffered["fio_1job"] = lambda: fio_read_gbs(files, 1, base, fb)
        direct_io[f"fio_direct_{qd}jobs"] = lambda: fio_read_gbs(files, qd, base, fb, True)
    else:
        buffered["python_seq"] = lambda: python_read_gbs(files)
        direct_io = {}
    runs: dict[str, dict[str, list[tuple[float, float]]]] = {"cold": {}, "warm": {}, "direct": {}}
    method = ""
    for _ in range(args.reps):
        for key, fn in buffered.items():
            method = drop_caches(files)
            runs["cold"].setdefault(key, []).append(_timed(fn))
            fn()  # make sure everything is cached
            runs["warm"].setdefault(key, []).append(_timed(fn))
        for key, fn in direct_io.items():  # O_DIRECT: no page cache, so no warm case
            drop_caches(files)
            runs["direct"].setdefault(key, []).append(_timed(fn))
    if "mooncake" in args.backends and not missing("mooncake"):
        runs["memory"] = mooncake_runs(layout, args, store_read_gbs, _timed)
    gb = len(hashes) * fb / 1e9
    result: dict[str, object] = {
        "case": name,
        "full_block_bytes": layout.full_block_bytes,
        "num_blocks": len(hashes),
        "blocks_per_request": per_req,
        "data_gb": gb,
        "cache_drop": method,
    }
    result.update({mode: _summary(per, gb) for mode, per in runs.items() if per and mode != "memory"})
    if runs.get("memory"):
        mc_gb = runs["memory"].pop("_gb")[0][0]  # (the data the memory mode moved)
        result["memory"] = _summary(runs["memory"], mc_gb) | {"data_gb": mc_gb}
    shutil.rmtree(root)
    for view in base.glob("fio-view-*"):
        shutil.rmtree(view)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data-mb", type=int, default=1024, help="data per case (MB)")
    ap.add_argument("--queue-depth", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--blocks-per-request", type=int, default=8,
                    help="blocks per store request (capped at 64 MB)")  # fmt: skip
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--backends", default="posix,nixl-posix,mooncake",
                    help="storage backends to measure (posix always: it is the baseline store)")  # fmt: skip
    ap.add_argument("--mooncake-mb", type=int, default=256, help="data per case in the Mooncake Store (MB)")
    ap.add_argument("--dir", default=None, help="where to put the data (default: a temp dir)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    args.backends = tuple(b.strip() for b in args.backends.split(","))
    skipped = {b: why for b in args.backends if (why := missing(b))}
    base = Path(tempfile.mkdtemp(prefix="dualpath-kvbench-", dir=args.dir))
    try:
        results = [run_case(c, args, base) for c in args.cases.split(",")]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps({"queue_depth": args.queue_depth, "skipped": skipped, "results": results}))
        return
    baseline = "fio" if shutil.which("fio") else "python sequential read (fio not installed)"
    print(f"baseline: {baseline}; queue depth {args.queue_depth}; best of {args.reps} reps")
    for b, why in skipped.items():
        print(f"backend {b} not measured: {why}")
    for r in results:
        print(f"\n{r['case']}: {r['num_blocks']} blocks x {r['full_block_bytes'] / 1e6:.2f} MB "
              f"= {r['data_gb']:.2f} GB (cold via {r['cache_drop']})")  # fmt: skip
        for mode in ("cold", "warm", "direct", "memory"):
            c = r.get(mode)
            if not isinstance(c, dict):
                continue
            rates = "  ".join(f"{k} {v:.2f}" for k, v in c["gbs_best"].items())
            cpu = "  ".join(f"{k} {v:.2f}" for k, v in c["cpu_s_per_gb"].items())
            ratios = "  ".join(
                f"{k} {v:.2f} (paired {c['ratio_paired_median'][k]:.2f})" for k, v in c["ratio"].items()
            )
            print(f"  {mode:6} GB/s: {rates}")
            print(f"  {mode:6} CPU s/GB: {cpu}")
            if mode != "memory":
                print(f"  {mode:6} store / fio, best of reps (median per-rep pair): {ratios}  goal >= 0.85")
            vs = "  ".join(f"{k} {v:.2f}" for k, v in c["ratio_vs"].items())
            print(f"  {mode:6} each store / each baseline, best of reps: {vs}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""vLLM-CPU with DualPath's KV connector: prompt time of a first turn (miss) against later turns of the
same conversation (hits from the store), and the connector against vLLM's own prefix cache.

Four vLLM instances, one after the other (one process each, ``dualpath.integrations.vllm.conversation``),
over the same greedy conversations (``--conversations`` of ``--turns`` turns, contexts growing):
``plain`` (no connector, prefix cache off: every prompt token computed), ``connector`` (DualPath's
connector over a fresh store, prefix cache off), ``prefix-cache`` (vLLM's own, no connector;
everything fits in its cache here) and ``connector+prefix-cache`` (both: the connector's cost when
vLLM's own cache already holds every hit, so it only saves). Prompt time is vLLM's scheduled -> first token time of each
request; the table gives medians over conversations (the machine may be shared). Checks the tokens
of the three runs are equal. Run it in the vLLM venv (docs/vllm.md)::

    python benchmarks/vllm_dualpath.py --model DIR [--conversations 3 --turns 4] [--json]

``--part pd``: vLLM 1P2D (one prefill, two decode instances, a DualPath agent per node, the proxy;
``dualpath.integrations.vllm.cluster``) with each node's storage NIC capped at ``--snic-gbps``, the
same turns in Basic (every hit read by the prefill node), DualPath (read side from the nodes' read
queues, ``dualpath.policy``) and no-I/O (DualPath with the caps lifted) modes, in one run; goals
DualPath / Basic >= 2.5x and DualPath / no-I/O >= 0.85 (turns per second)::

    python benchmarks/vllm_dualpath.py --model DIR --part pd [--snic-gbps 0.04] [--json]

Several ``--snic-gbps`` values sweep the cap (one cluster per value, each printing both ratios).

``--part hbm``: the connector's cost when everything fits in vLLM's cache: ``prefix-cache`` and
``connector+prefix-cache`` run at the same time (so a shared machine's load hits both alike) over the
same conversations; the connector must load nothing (vLLM's own cache covers every hit) and its
saves must not slow the turns: prints with / without connector prompt-time ratios (goal <= 1.05)::

    python benchmarks/vllm_dualpath.py --model DIR --part hbm [--conversations 4 --turns 4]

``--part single`` is the one-instance comparison above; ``--part all`` runs all three.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

MODES = ("plain", "connector", "prefix-cache", "connector+prefix-cache")


def _start(
    mode: str, args: argparse.Namespace, tmp: Path, extra: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "dualpath.integrations.vllm.conversation", args.model, "--mode", mode,
           "--turns", str(args.turns), "--conversations", str(args.conversations), "--gen-len", str(args.gen_len),
           "--context-repeats", str(args.context_repeats), "--vllm-block-size", str(args.block_size),
           "--out", str(tmp / f"{mode}.json"), *extra]  # fmt: skip
    if mode.startswith("connector"):
        cmd += ["--store-dir", str(tmp / f"store-{mode}")]
    print(f"running {mode} ...", file=sys.stderr, flush=True)
    log = open(tmp / f"{mode}.log", "wb")  # noqa: SIM115 (closed with the process by _finish)
    return subprocess.Popen(cmd, env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2"), stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip


def _finish(mode: str, proc: subprocess.Popen[bytes], tmp: Path) -> dict[str, Any]:
    rc = proc.wait()
    if rc != 0:
        sys.exit(f"error: {mode} run failed (rc {rc}); log: {(tmp / f'{mode}.log').read_text()[-3000:]}")
    return json.loads((tmp / f"{mode}.json").read_text())


def _run(mode: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    return _finish(mode, _start(mode, args, tmp), tmp)


def _first_and_later(run: dict[str, Any]) -> tuple[float, float, float]:
    """Median prompt time of first turns, of later turns, and the later turns' mean hit share."""
    steps = [s for s in run["steps"] if "tokens" in s and s["step"] != "B0"]
    first = [s["prefill_s"] for s in steps if s["step"].endswith("T0") or s["step"] == "A0"]
    later = [s for s in steps if not (s["step"].endswith("T0") or s["step"] == "A0")]
    share = statistics.mean(s["cached_tokens"] / s["prompt_len"] for s in later)
    return statistics.median(first), statistics.median(s["prefill_s"] for s in later), share


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="HF folder (dualpath model export smollm2-135m DIR)")
    p.add_argument("--conversations", type=int, default=3)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--gen-len", type=int, default=4)
    p.add_argument(
        "--context-repeats", type=int, default=30, help="first prompt: topic x N (~30 tokens each)"
    )
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--part", choices=("single", "pd", "hbm", "all"), default="all")
    p.add_argument("--snic-gbps", type=float, nargs="+", default=[0.05],
                   help="pd: each node's storage-NIC cap (several: one cluster per cap, a sweep)")  # fmt: skip
    p.add_argument("--pd-conversations", type=int, default=6, help="pd: concurrent turns per round")
    p.add_argument("--pd-rounds", type=int, default=2)
    p.add_argument("--pd-turns-per-round", type=int, default=1,
                   help="pd: turns each agent runs back to back per round (closed loop)")  # fmt: skip
    p.add_argument("--pd-modes", default="basic,dualpath,no-io",
                   help="pd: comma-separated modes of dualpath.integrations.vllm.pdbench (add split)")  # fmt: skip
    p.add_argument("--vllm-python", default=sys.executable, help="pd: the vLLM venv's python")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.part in ("pd", "all"):
        _pd(args)
    if args.part in ("single", "all"):
        _single(args)
    if args.part in ("hbm", "all"):
        _hbm(args)


def _hbm(args: argparse.Namespace) -> None:
    """vLLM's prefix cache on, with and without the connector, both at once and in lockstep (every
    turn starts in both together, so one machine's load hits both alike): every hit is vLLM's own,
    so the connector must load nothing and only save."""
    modes = ("prefix-cache", "connector+prefix-cache")
    with tempfile.TemporaryDirectory(prefix="vllm-hbm-") as tmp_:
        tmp = Path(tmp_)
        counters = tmp / "counters.json"
        (tmp / "lockstep").mkdir()
        procs = {m: _start(m, args, tmp, ("--lockstep-dir", str(tmp / "lockstep"), "--lockstep-id", str(i),
                                          "--lockstep-peers", str(len(modes)))
                           + (("--counters-file", str(counters)) if m.startswith("connector") else ()))
                 for i, m in enumerate(modes)}  # fmt: skip
        runs = {m: _finish(m, p, tmp) for m, p in procs.items()}
        conn = json.loads(counters.read_text())
    toks = {m: [s["tokens"] for s in r["steps"] if "tokens" in s] for m, r in runs.items()}
    rows = {m: dict(zip(("first_s", "later_s", "later_hit_share"), _first_and_later(r), strict=True))
            | {"wall_s": sum(s["wall_s"] for s in r["steps"] if "tokens" in s)} for m, r in runs.items()}  # fmt: skip
    both, pc = rows["connector+prefix-cache"], rows["prefix-cache"]
    turn_s = {m: [s["prefill_s"] for s in r["steps"] if "tokens" in s] for m, r in runs.items()}
    paired = statistics.median(a / b for a, b in zip(turn_s[modes[1]], turn_s[modes[0]], strict=True))
    result = {
        "tokens_equal": toks[modes[0]] == toks[modes[1]], "modes": rows,
        "connector_loaded_blocks": conn["loaded_blocks"], "connector_saved_blocks": conn["saved_blocks"],
        "connector_timing": conn.get("timing", {}),
        "later_ratio": both["later_s"] / pc["later_s"], "first_ratio": both["first_s"] / pc["first_s"],
        "wall_ratio": both["wall_s"] / pc["wall_s"], "paired_turn_ratio_median": paired, "load_average": os.getloadavg(), "args": vars(args),
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"vLLM prefix cache on, everything fits (median of {args.conversations} conversations, "
          f"tokens equal: {result['tokens_equal']}, load average {result['load_average'][1]:.1f}):")  # fmt: skip
    for m, r in rows.items():
        print(f"  {m:24s} first turn {r['first_s']:.3f} s  later turns {r['later_s']:.3f} s  "
              f"hit share {r['later_hit_share']:.2f}  all turns {r['wall_s']:.1f} s")  # fmt: skip
    print(f"connector loaded {conn['loaded_blocks']} blocks (0: vLLM's cache covered every hit), saved "
          f"{conn['saved_blocks']}; with / without connector: later turns {result['later_ratio']:.2f}x, "
          f"first turns {result['first_ratio']:.2f}x, all turns {result['wall_ratio']:.2f}x, median of per-turn "
          f"ratios {paired:.2f}x (goal <= 1.05)")  # fmt: skip
    t = result["connector_timing"]
    print("connector worker timing: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                   for k, v in t.items()))  # fmt: skip


def _pd(args: argparse.Namespace) -> None:
    from dualpath.integrations.vllm import pdbench

    pdbench.parse_modes(args.pd_modes, "--pd-modes")  # a bad mode stops here, before any vLLM starts
    results = [_pd_one(args, gbps) for gbps in args.snic_gbps]
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0], indent=2))


def _pd_one(args: argparse.Namespace, snic_gbps: float) -> dict[str, Any]:
    from dualpath.integrations.vllm import pdbench
    from dualpath.integrations.vllm.cluster import PDCluster, PDConfig

    with tempfile.TemporaryDirectory(prefix="vllm-pd-") as tmp:
        cfg = PDConfig(model=args.model, root=tmp, num_decode=2, snic_gbps=snic_gbps,
                       vllm_python=args.vllm_python, block_size=args.block_size)  # fmt: skip
        with PDCluster(cfg) as cluster:
            cluster.start(on_progress=lambda n: print(f"  {n} healthy", file=sys.stderr, flush=True))
            result = pdbench.run(cluster, modes=pdbench.parse_modes(args.pd_modes, "--pd-modes"), conversations=args.pd_conversations,
                                 rounds=args.pd_rounds,
                                 turns_per_round=args.pd_turns_per_round,
                                 progress=lambda s: print(f"  {s}", file=sys.stderr, flush=True))  # fmt: skip
    r = result["ratios"] = pdbench.ratios(result)
    result["goals_met"] = {"dualpath_over_basic >= 2.5": r["dualpath_over_basic"] >= 2.5,
                           "dualpath_over_noio >= 0.85": r["dualpath_over_noio"] >= 0.85}  # fmt: skip
    result["snic_gbps"] = snic_gbps
    result["load_average"] = os.getloadavg()
    if args.json:
        return result
    print(f"vLLM 1P2D, storage NICs {snic_gbps} Gbit/s per node, "
          f"{args.pd_conversations} conversations x {args.pd_rounds} rounds x {args.pd_turns_per_round} turns per mode, "
          f"load average {result['load_average'][1]:.1f} (5 min)")  # fmt: skip
    for mode, m in result["modes"].items():
        b = m["bytes"]
        print(f"  {mode:9s} {m['turns_per_s']:.3f} turns/s  wall {m['wall_s']:.1f} s  prefill "
              f"{m['prefill_s_median']:.2f} s  decode {m['decode_s_median']:.2f} s  sides {m['read_sides']}  "
              f"PE-read {b.get('pe_read_bytes', 0) / 1e6:.0f} MB  DE-read {b.get('de_read_bytes', 0) / 1e6:.0f} MB  "
              f"forwarded {b.get('forwarded_bytes', 0) / 1e6:.0f} MB")  # fmt: skip
    print(
        f"DualPath / Basic = {r['dualpath_over_basic']:.2f}x (goal >= 2.5); "
        f"DualPath / no-I/O = {r['dualpath_over_noio']:.2f} (goal >= 0.85)",
        flush=True,
    )
    if "split_over_basic" in r:
        print(
            f"split / Basic = {r['split_over_basic']:.2f}x; split / no-I/O = {r['split_over_noio']:.2f}",
            flush=True,
        )
    return result


def _single(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="vllm-dualpath-") as tmp:
        runs = {m: _run(m, args, Path(tmp)) for m in MODES}
    toks = {m: [s["tokens"] for s in r["steps"] if "tokens" in s] for m, r in runs.items()}
    tokens_equal = all(t == toks["plain"] for t in toks.values())
    rows = {m: dict(zip(("first_s", "later_s", "later_hit_share"), _first_and_later(r), strict=True))
            | {"start_s": r["start_s"]} for m, r in runs.items()}  # fmt: skip
    result = {
        "tokens_equal": tokens_equal, "modes": rows,
        "connector_first_over_later": rows["connector"]["first_s"] / rows["connector"]["later_s"],
        "plain_later_over_connector_later": rows["plain"]["later_s"] / rows["connector"]["later_s"],
        "connector_later_over_prefix_cache_later": rows["connector"]["later_s"] / rows["prefix-cache"]["later_s"],
        # the connector's cost when vLLM's own cache holds everything (it then only saves)
        "both_over_prefix_cache_first": rows["connector+prefix-cache"]["first_s"] / rows["prefix-cache"]["first_s"],
        "both_over_prefix_cache_later": rows["connector+prefix-cache"]["later_s"] / rows["prefix-cache"]["later_s"],
        "args": vars(args),
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"vLLM-CPU prompt time (median of {args.conversations} conversations), tokens equal: "
                    f"{tokens_equal}")  # fmt: skip
    for col in ("mode", "start (s)", "first turn (s)", "later turns (s)", "later: hit share"):
        t.add_column(col)
    for m, r in rows.items():
        t.add_row(
            m,
            f"{r['start_s']:.0f}",
            f"{r['first_s']:.3f}",
            f"{r['later_s']:.3f}",
            f"{r['later_hit_share']:.2f}",
        )
    Console().print(t)
    print(
        f"connector: first / later turn = {result['connector_first_over_later']:.2f}x; "
        f"plain later / connector later = {result['plain_later_over_connector_later']:.2f}x; "
        f"connector later / prefix-cache later = {result['connector_later_over_prefix_cache_later']:.2f}x; "
        f"connector+prefix-cache / prefix-cache: first {result['both_over_prefix_cache_first']:.2f}x, "
        f"later {result['both_over_prefix_cache_later']:.2f}x"
    )


if __name__ == "__main__":
    main()

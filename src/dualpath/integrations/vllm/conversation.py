"""A multi-turn conversation through one vLLM instance (offline ``vllm.LLM``): the correctness test's
and the benchmark's driver. Run one instance per process::

    python -m dualpath.integrations.vllm.conversation MODEL_DIR --mode connector --store-dir DIR

Modes: ``plain`` (no connector, vLLM's prefix cache off: the reference), ``connector`` (DualPath's
connector, vLLM's prefix cache off), ``prefix-cache`` (vLLM's own prefix cache, no connector),
``connector+prefix-cache`` (both: the connector loads only what vLLM's own cache lacks).
The steps, all greedy: turns of conversation A whose context grows by each answer and a new
question; then a prompt sharing only the start of A's first turn (a partial hit); then, with
``--corrupt``, one stored block of A is damaged on disk before A's last turn (connector mode only;
the block must be a miss, recomputed, and the tokens still equal). ``--conversations N`` first runs
N-1 more conversations (steps ``C<c>T<turn>``, each its own topic, so its first turn misses) to
repeat the timings. ``--prompts FILE`` answers the given token-id prompts instead, one at a time
(``{"tokens": [...]}``: the P/D test's reference). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from dualpath.integrations.vllm import CONNECTOR_CLASS, CONNECTOR_MODULE

MODES = ("plain", "connector", "prefix-cache", "connector+prefix-cache")
_TOPIC = ("The river city grew from a trading post where boats unloaded salt, grain and timber; "
          "its markets, bridges and guild halls were rebuilt after each flood. ")  # fmt: skip
_OTHER = " Set that aside. A different question: who built the stone bridges, and why? " * 3


def kv_transfer_config(store_dir: str, block_size: int | None = None, **extra_config: Any) -> dict[str, Any]:
    """The ``--kv-transfer-config`` that loads DualPath's connector over ``store_dir`` (more
    ``kv_connector_extra_config`` keys as keywords: ``load="async"``, ``counters_file=...``)."""
    extra: dict[str, Any] = {"store_dir": store_dir, **extra_config}
    if block_size is not None:
        extra["block_size"] = block_size
    return {"kv_connector": CONNECTOR_CLASS, "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": extra}  # fmt: skip


def corrupt_one_block(store_dir: str, token_ids: list[int], block_size: int, which: int) -> str:
    """Flip bytes in the data of stored block ``which`` of ``token_ids``'s chain; returns its hash."""
    from dualpath.runtime.kvstore.files import block_path
    from dualpath.runtime.kvstore.layout import chain_hashes

    h = chain_hashes(token_ids, block_size)[which]
    path = block_path(Path(store_dir), h)
    data = bytearray(path.read_bytes())
    for i in range(len(data) - 64, len(data)):  # the last layer's bytes: found mid-load
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    return h


def _lockstep(root: Path, me: int, peers: int, k: int, timeout_s: float = 1800.0) -> None:
    """A file barrier: mark turn ``k`` reached by ``me``, wait until all ``peers`` reached it."""
    (root / f"{me}.{k}").touch()
    deadline = time.monotonic() + timeout_s
    while not all((root / f"{p}.{k}").exists() for p in range(peers)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"lockstep: peers of turn {k} missing after {timeout_s} s under {root}")
        time.sleep(0.01)


def _cpu_threads() -> None:
    """vLLM-CPU's environment for a shared machine: a small KV space, unpinned single threads."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # vLLM-CPU's "auto" binding pins the engine's OpenMP threads to cores it picks ([0] in one run,
    # [0, 1] in the next): instances on a shared machine then fight over one core, or stall at OpenMP
    # barriers when a pinned thread is descheduled. Unpinned and one thread each, the OS balances
    # them (docs/vllm.md; unpinned with vLLM's default two threads is several times slower here).
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _llm_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """vLLM's ``LLM`` arguments of ``--mode`` (the connector's KV transfer config for connector modes)."""
    kw: dict[str, Any] = dict(model=args.model, max_model_len=args.max_model_len, enforce_eager=True,
                              block_size=args.vllm_block_size, dtype="float32", max_num_seqs=4,
                              enable_prefix_caching=args.mode.endswith("prefix-cache"),
                              disable_log_stats=False, seed=0)  # fmt: skip
    if args.mode.startswith("connector"):
        more = {"load": args.load} | ({"counters_file": args.counters_file} if args.counters_file else {})
        kw["kv_transfer_config"] = kv_transfer_config(args.store_dir, args.store_block_size, **more)
    return kw


def run(args: argparse.Namespace) -> dict[str, Any]:
    _cpu_threads()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(**_llm_kwargs(args))
    start_s = time.perf_counter() - t0
    tok = llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=args.gen_len, ignore_eos=True)
    if args.prompts:  # given prompts (token ids), one at a time: the P/D test's reference
        prompts = json.loads(Path(args.prompts).read_text())
        outs = [llm.generate([TokensPrompt(prompt_token_ids=p)], params, use_tqdm=False)[0] for p in prompts]
        return {"mode": args.mode, "start_s": start_s, "tokens": [list(o.outputs[0].token_ids) for o in outs]}
    first = tok.encode(_TOPIC * args.context_repeats)
    steps: list[dict[str, Any]] = []

    def step(name: str, prompt: list[int]) -> list[int]:
        if args.lockstep_dir:  # every peer starts this turn together: a shared machine's load hits all
            _lockstep(Path(args.lockstep_dir), args.lockstep_id, args.lockstep_peers, len(steps))
        t = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0]
        wall = time.perf_counter() - t
        m = out.metrics
        prefill = (m.first_token_ts - m.scheduled_ts) if m is not None and m.first_token_ts else None
        ids = list(out.outputs[0].token_ids)
        steps.append({"step": name, "prompt_len": len(prompt), "tokens": ids, "wall_s": wall,
                      "prefill_s": prefill, "cached_tokens": out.num_cached_tokens or 0})  # fmt: skip
        return ids

    for c in range(1, args.conversations):  # more conversations (timing repeats): own topics
        ctx = tok.encode(f"Story {c}. " + _TOPIC * args.context_repeats)
        for turn in range(args.turns):
            ids = step(f"C{c}T{turn}", ctx)
            ctx = ctx + ids + tok.encode(f" Question {turn + 1}: what happened to the river city next?")
    ctx = first
    for turn in range(args.turns):
        if turn == args.turns - 1 and args.corrupt and args.mode == "connector":
            size = args.store_block_size or args.vllm_block_size
            steps.append({"step": "corrupt", "block_hash": corrupt_one_block(args.store_dir, ctx, size, 1)})
        ids = step(f"A{turn}", ctx)
        if turn == 0:  # a second conversation sharing the start of A's first prompt: a partial hit
            step("B0", first[: len(first) // 2] + tok.encode(_OTHER))
        ctx = ctx + ids + tok.encode(f" Question {turn + 1}: what happened to the river city next?")
    return {"mode": args.mode, "start_s": start_s, "steps": steps}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", help="HF folder (dualpath model export smollm2-135m DIR)")
    p.add_argument("--mode", choices=MODES, default="connector")
    p.add_argument("--store-dir", default="")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--gen-len", type=int, default=8)
    p.add_argument(
        "--conversations", type=int, default=1, help="extra ones (C1.., run first) repeat the timing"
    )
    p.add_argument("--context-repeats", type=int, default=8, help="first prompt: the topic x N")
    p.add_argument("--vllm-block-size", type=int, default=32)
    p.add_argument("--store-block-size", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--corrupt", action="store_true")
    p.add_argument("--out", default="", help="write the JSON here (else stdout)")
    p.add_argument("--load", choices=("layerwise", "async"), default="layerwise")
    p.add_argument("--counters-file", default="", help="connector modes: its counters and step timings")
    p.add_argument("--prompts", default="", help="a JSON list of token-id prompts to answer instead")
    p.add_argument("--lockstep-dir", default="", help="start every turn together with the peers here")
    p.add_argument("--lockstep-id", type=int, default=0, help="this run's index among the peers")
    p.add_argument("--lockstep-peers", type=int, default=1, help="how many runs share --lockstep-dir")
    args = p.parse_args(argv)
    if args.mode.startswith("connector") and not args.store_dir:
        p.error("--mode connector needs --store-dir")
    text = json.dumps(run(args))
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()

"""Where a vLLM step's time goes, with DualPath's connector or without: one engine in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), with timers around the model runner's ``execute_model``,
the model forward, the CPU attention backend and each connector hook; then per kind of step (hit
turns, miss turns, decode) the medians. Runs ``dualpath.integrations.vllm.conversation`` (same
arguments) in the vLLM venv. Run two at once (connector and ``--mode prefix-cache``) so that a
shared machine's load hits both alike (docs/vllm.md, "A connector hit turn")::

    python benchmarks/vllm_hit_trace.py DIR --mode connector --store-dir S --conversations 5 --turns 3 \\
        --context-repeats 20 --out c.json &
    python benchmarks/vllm_hit_trace.py DIR --mode prefix-cache --conversations 5 --turns 3 \\
        --context-repeats 20 --out p.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HOOKS = ("start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save")


def _timed(cls: type, name: str, cur: dict[str, float], key: str | None = None) -> None:
    orig: Callable[..., Any] = getattr(cls, name)

    def wrapper(self: Any, *a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return orig(self, *a, **k)
        finally:
            cur[key or name] = cur.get(key or name, 0.0) + time.perf_counter() - t

    setattr(cls, name, wrapper)


def main() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
    from vllm.v1.attention.backends import cpu_attn
    from vllm.v1.worker import gpu_model_runner as gmr

    from dualpath.integrations.vllm import connector, conversation

    steps: list[dict[str, Any]] = []
    cur: dict[str, float] = {}
    run_step = gmr.GPUModelRunner.execute_model

    def execute_model(self: Any, scheduler_output: Any, *a: Any, **k: Any) -> Any:
        cur.clear()
        t, wall = time.perf_counter(), time.time()
        out = run_step(self, scheduler_output, *a, **k)
        steps.append({"t": wall, "tokens": scheduler_output.total_num_scheduled_tokens,
                      "computed": [r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs],
                      "step_s": time.perf_counter() - t, **cur})  # fmt: skip
        return out

    gmr.GPUModelRunner.execute_model = execute_model  # type: ignore[method-assign]
    _timed(gmr.GPUModelRunner, "_model_forward", cur, "forward_s")
    _timed(cpu_attn.CPUAttentionBackendImpl, "forward", cur, "attention_s")
    for hook in HOOKS:
        _timed(connector.DualPathConnector, hook, cur)
    argv = sys.argv[1:]
    if "--out" not in argv:
        sys.exit("error: --out FILE is required (the conversation's JSON, with the step timings added)")
    conversation.main(argv)
    out = Path(argv[argv.index("--out") + 1])
    result = json.loads(out.read_text()) | {"engine_steps": steps}
    out.write_text(json.dumps(result))
    kinds = {"hit": [s for s in steps if s["computed"] and s["computed"][0] > 0],
             "miss": [s for s in steps if s["computed"] == [0]],
             "decode": [s for s in steps if s["tokens"] == 1 and not s["computed"]]}  # fmt: skip
    for kind, rows in kinds.items():
        if not rows:
            continue
        own = [sum(s.get(h, 0.0) for h in HOOKS) for s in rows]
        print(f"{kind:6s} n={len(rows):3d}  step median {statistics.median(s['step_s'] for s in rows):.3f} s "
              f"(min {min(s['step_s'] for s in rows):.3f})  connector hooks median {statistics.median(own):.3f} s "
              f"(min {min(own):.3f})")  # fmt: skip


if __name__ == "__main__":
    main()

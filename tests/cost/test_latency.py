"""Deployment TTFT / TPOT: breakdowns that add up, sensible directions, errors naming the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualpath.core.errors import ConfigError
from dualpath.cost.deployment import Deployment, Layout, predict
from dualpath.cost.latency_terms import Parallel, Precision
from dualpath.spec.models import get_model


def _agg(**kw: object) -> Deployment:
    base: dict[str, object] = dict(
        model="Qwen/Qwen3-32B",
        system="h100_sxm",
        precision="fp8",
        isl=4000,
        osl=500,
        batch_size=32,
        layout=Layout(tp=2),
    )
    base.update(kw)
    return Deployment(**base)  # type: ignore[arg-type]


def _sum(part: dict[str, float]) -> float:
    return sum(v for k, v in part.items())


def test_agg_breakdowns_sum_to_ttft_and_tpot() -> None:
    p = predict(_agg())
    assert p.ttft_s * 1e3 == pytest.approx(_sum(p.breakdown_ms["ttft"]))
    assert p.tpot_s * 1e3 == pytest.approx(_sum(p.breakdown_ms["tpot"]))
    assert set(p.breakdown_ms["ttft"]) <= set(p.source) | {"wait_for_iteration", "queue_wait", "pp_p2p"}


def test_disagg_breakdown_sums_and_reports_transfer() -> None:
    dep = Deployment(
        model="deepseek-ai/DeepSeek-R1",
        system="h200_sxm",
        mode="disagg",
        isl=4000,
        osl=1000,
        batch_size=64,
        prefill=Layout(tp=8),
        prefill_batch=1,
        decode=Layout(tp=8, attention_dp=8, moe_ep=8),
        decode_batch=64,
    )
    p = predict(dep)
    ttft = {k: v for k, v in p.breakdown_ms["ttft"].items()}
    assert p.ttft_s * 1e3 == pytest.approx(_sum(ttft))
    assert p.tpot_s * 1e3 == pytest.approx(_sum(p.breakdown_ms["tpot"]))
    assert ttft["kv_transfer"] > 0
    assert 1.0 <= p.breakdown_ms["batch"]["decode_batch"] <= 64


def test_more_concurrency_more_tpot_and_longer_prompt_more_ttft() -> None:
    low, high = predict(_agg(batch_size=4)), predict(_agg(batch_size=64))
    assert low.tpot_s < high.tpot_s
    short, long = predict(_agg(isl=1000)), predict(_agg(isl=8000))
    assert short.ttft_s < long.ttft_s


def test_more_tp_lowers_batch_one_tpot() -> None:
    tp1 = predict(_agg(batch_size=1, layout=Layout(tp=1)))
    tp4 = predict(_agg(batch_size=1, layout=Layout(tp=4)))
    assert tp4.tpot_s < tp1.tpot_s


def test_a_data_dir_without_tables_reads_the_bundled_ones(tmp_path: Path) -> None:
    p = predict(_agg(system="h200_sxm"), data_dir=tmp_path)
    assert p.source["mlp_gemm"].startswith("table gemm_perf")
    assert p.source["attn_generation"].startswith("table generation_attention_perf")


def test_without_tables_every_op_says_where_it_came_from(tmp_path: Path) -> None:
    p = predict(_agg(system="gb200"), data_dir=tmp_path)  # none in the folder, none bundled
    assert p.ttft_s > 0 and p.tpot_s > 0
    assert "attn_context" in p.fallback_ops and "mlp_gemm" in p.fallback_ops
    # GB200 reads its kin's tables (B200, then H200) and re-times them by the roofline
    assert "roofline" in p.source["mlp_gemm"] and "gb200" not in p.source["mlp_gemm"]


def test_tables_used_where_they_have_points(reference_data: Path) -> None:
    p = predict(_agg(), data_dir=reference_data)
    assert p.source["mlp_gemm"] == "table gemm_perf fp8"
    assert p.source["attn_generation"] == "table generation_attention_perf"
    assert p.fallback_ops == ("elementwise",)


def test_layout_conventions_and_errors() -> None:
    # TensorRT-LLM's convention: tp is the world, attention DP splits it
    assert Layout(tp=8, attention_dp=8, moe_ep=8).resolve() == Parallel(
        tp=1, attention_dp=8, moe_tp=1, moe_ep=8
    )
    assert Layout(tp=1, attention_dp=8, moe_ep=8).resolve() == Parallel(
        tp=1, attention_dp=8, moe_tp=1, moe_ep=8
    )
    assert Layout(tp=4).resolve() == Parallel(tp=4, moe_tp=4, moe_ep=1)
    with pytest.raises(ConfigError, match="tp"):
        predict(_agg(layout=Layout(tp=3)))
    with pytest.raises(ConfigError, match="model"):
        predict(_agg(model="acme/Nothing"))
    with pytest.raises(ConfigError, match="system"):
        predict(_agg(system="tpu_v9"))
    with pytest.raises(ConfigError, match="mode"):
        _agg(mode="hybrid")


def test_precision_follows_the_checkpoint() -> None:
    assert Precision.resolve(get_model("deepseek-r1"), "fp8") == Precision(
        gemm="fp8_block", moe="fp8_block", kv="fp8"
    )
    assert Precision.resolve(get_model("gpt-oss-120b")) == Precision(
        gemm="bfloat16", moe="w4a16_mxfp4", kv="bfloat16"
    )
    assert Precision.resolve(get_model("qwen3-32b"), "fp8").gemm == "fp8"
    with pytest.raises(ConfigError, match="precision"):
        Precision.resolve(get_model("qwen3-32b"), "int3")


def test_kv_capacity_caps_the_running_batch() -> None:
    from dualpath.cost.memory import max_requests_per_rank, weight_bytes_per_gpu
    from dualpath.spec.systems import get_system

    model = get_model("qwen3-32b")
    prec = Precision.resolve(model, "bf16")
    par = Parallel(tp=1)
    # 32.8B BF16 parameters on one GPU: about 65.5 GB of weights
    assert weight_bytes_per_gpu(model, par, prec) == pytest.approx(65.5e9, rel=0.01)
    h100, h200 = get_system("h100_sxm").gpu, get_system("h200_sxm").gpu
    assert max_requests_per_rank(model, par, prec, h100, 4500) < max_requests_per_rank(
        model, par, prec, h200, 4500
    )
    assert max_requests_per_rank(model, Parallel(tp=2), prec, h100, 4500) > 2 * max_requests_per_rank(
        model, par, prec, h100, 4500
    )
    full = predict(_agg(precision="bf16", layout=Layout(tp=1), batch_size=64, osl=200))
    assert full.breakdown_ms["batch"]["running_per_rank"] < 64
    assert any("KV cache holds" in n for n in full.notes)
    assert full.breakdown_ms["ttft"]["queue_wait"] > 0


def test_weights_that_do_not_fit_are_noted_not_refused() -> None:
    p = predict(
        Deployment(
            model="deepseek-r1",
            system="h100_sxm",
            precision="fp8",
            isl=1000,
            osl=100,
            batch_size=8,
            layout=Layout(tp=8),
        )
    )
    assert p.tpot_s > 0 and any("weights leave" in n for n in p.notes)


def test_pipeline_parallel_runs_and_costs_the_hops() -> None:
    p = predict(_agg(layout=Layout(tp=1, pp=2)))
    assert p.breakdown_ms["ttft"]["pp_p2p"] > 0 and p.tpot_s > 0


def test_prefill_only_closed_loop_is_prefill_bound() -> None:
    one = predict(_agg(osl=1, batch_size=1, isl=2000))
    many = predict(_agg(osl=1, batch_size=16, isl=2000))
    assert many.tpot_s == 0.0
    # 16 clients in groups of 4 prompts: each waits for the other three groups
    assert many.ttft_s > 3 * one.ttft_s


def test_overlapped_schedulers_wait_for_the_previous_groups_prefills() -> None:
    # 32 clients of 4000 tokens: 16 groups of 2 prompts in consecutive iterations; a re-submitted
    # request waits for the extra step and the iteration scheduled before it arrived, which are
    # the previous two groups' prefills (but for the first two groups)
    p = predict(_agg())
    batch = p.breakdown_ms["batch"]
    assert batch["groups"] == 16 and batch["wait_iterations"] == 2
    assert batch["prefill_iterations_in_wait"] == pytest.approx((0 + 1 + 2 * 14) / 16)
    own = p.ttft_s * 1e3 - p.breakdown_ms["ttft"]["wait_for_iteration"] - p.breakdown_ms["ttft"]["queue_wait"]
    assert p.breakdown_ms["ttft"]["wait_for_iteration"] > 1.5 * own


def test_chunked_prefill_ttft_does_not_fall_where_the_prompt_crosses_the_budget() -> None:
    # vLLM and SGLang fill each prefill iteration to the budget (8192 less the decode rows), so a
    # prompt just longer than it straddles like one just shorter (until session 13 an even split
    # made TTFT fall by a quarter there)
    isls = [7000, 8000, 8159, 8160, 8161, 8162, 8200, 9000, 12000, 16000, 16320, 16400]
    for backend in ("vllm", "sglang"):
        ttft = [predict(_agg(backend=backend, isl=i, osl=200)).ttft_s for i in isls]
        assert all(b >= a * 0.98 for a, b in zip(ttft, ttft[1:], strict=False)), (backend, ttft)


def test_sglang_prefills_apart_and_its_groups_fall_into_step() -> None:
    # SGLang pauses decoding for a prefill batch, so the groups start and finish together:
    # a request waits on average for half the round's prefills, and decodes without the others'
    vllm, sglang = predict(_agg(backend="vllm")), predict(_agg(backend="sglang"))
    assert sglang.ttft_s > 2 * vllm.ttft_s and sglang.tpot_s < vllm.tpot_s
    assert sglang.breakdown_ms["batch"]["decodes_per_prefill_iteration"] == 0
    one_v, one_s = predict(_agg(backend="vllm", batch_size=1)), predict(_agg(backend="sglang", batch_size=1))
    # one request: nothing to wait for but SGLang's overlapped extra step (one decode step); vLLM's
    # async scheduler skips it for a request it knows reaches max_tokens
    assert one_s.ttft_s - one_v.ttft_s == pytest.approx(one_s.tpot_s, rel=1e-6)
    assert sglang.ttft_s * 1e3 == pytest.approx(sum(sglang.breakdown_ms["ttft"].values()))
    assert sglang.tpot_s * 1e3 == pytest.approx(sum(sglang.breakdown_ms["tpot"].values()))


def test_quantised_re_releases_run_at_the_precision_their_name_carries() -> None:
    from dualpath.cost.deployment import precision_in_name

    assert precision_in_name("nvidia/Llama-3.1-8B-Instruct-FP8") == "fp8"
    assert precision_in_name("/models/nvidia/DeepSeek-R1-0528-FP4-v2") == "nvfp4"
    assert precision_in_name("Qwen/Qwen3-32B") is None
    named = predict(_agg(model="nvidia/Llama-3.1-8B-Instruct-FP8", precision=None, layout=Layout(tp=1)))
    given = predict(_agg(model="meta-llama/Llama-3.1-8B-Instruct", precision="fp8", layout=Layout(tp=1)))
    assert named.tpot_s == pytest.approx(given.tpot_s) and named.ttft_s == pytest.approx(given.ttft_s)

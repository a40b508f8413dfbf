"""The benchmark client against our API (over the in-process fake cluster)."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from dualpath.bench import BenchConfig, format_summary, plot_cdfs, run_bench, summarize
from dualpath.bench.agents import build_agents
from dualpath.bench.arrivals import arrival_times_s, trace_times_s
from dualpath.bench.client import TurnResult, _on_chunk
from dualpath.bench.report import cdf_figure
from dualpath.core.errors import ConfigError


def test_two_agents_two_turns_replay_exact_contexts(fake_server, tmp_path) -> None:
    url, fake = fake_server
    cfg = BenchConfig(url=url, num_agents=2, maxlen=8192, max_turns=2, seed=1, ttft_slo_s=60, tpot_slo_s=10)
    run = asyncio.run(run_bench(cfg))
    assert run.endpoint.max_context_len == 2048 and run.endpoint.vocab_size == 256
    assert len(run.results) == 4 and all(r.error is None for r in run.results)
    assert [len(a.turns) for a in run.agents] == [2, 2]
    prompts = [p for p, _ in fake.submitted]
    assert all(params.ignore_eos and params.temperature == 0.0 for _, params in fake.submitted)
    for a in run.agents:
        res = sorted((r for r in run.results if r.agent_index == a.index), key=lambda r: r.turn_index)
        for turn, r in zip(a.turns, res):
            assert r.prompt_len == turn.prompt_len  # lengths exactly as the trajectory says
            assert r.num_generated == turn.gen_len == len(r.token_ids or [])
        # turn 2's prompt = turn 1's prompt + turn 1's generated ids + the new append
        t1 = next(p for p in prompts if len(p) == res[0].prompt_len)
        t2 = next(p for p in prompts if len(p) == res[1].prompt_len and p[: len(t1)] == t1)
        assert t2[len(t1) : len(t1) + a.turns[0].gen_len] == res[0].token_ids
        assert len(t2) == len(t1) + a.turns[0].gen_len + a.turns[1].append_len
    result = summarize(run)
    assert result["completed"] == 4 and result["failed"] == 0 and result["failure_reasons"] == {}
    assert result["agents_completed"] == 2 and result["slo_attainment"] == 1.0
    assert result["total_input_tokens"] == sum(r.prompt_len for r in run.results)
    assert result["mean_jct_ms"] > 0 and result["p99_ttft_ms"] >= result["median_ttft_ms"] > 0
    assert result["exact_token_ids"] is True and result["request_rate"] == "inf"
    assert result["cache_counters"] == "dualpath"  # the fake's counters do not move: rate null
    assert result["cache_hit_rate"] is None
    json.dumps(result)
    png = plot_cdfs(run, tmp_path / "cdf.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_failures_are_counted_grouped_and_shown(fake_server) -> None:
    url, fake = fake_server
    fake.fail_after = 1
    cfg = BenchConfig(url=url, num_agents=3, max_turns=2, ttft_slo_s=1e-9, tpot_slo_s=1e-9)
    run = asyncio.run(run_bench(cfg))
    result = summarize(run)
    assert result["failed"] == 3 and result["num_prompts"] == 3  # agents stop at a failure
    assert result["failure_reasons"] == {"generation failed: decode engine 1 died": 3}
    assert result["slo_attainment"] == 0.0 and result["agents_completed"] == 0
    assert result["mean_ttft_ms"] is None and result["median_e2el_ms"] is None
    text = format_summary(result, cfg.metrics)
    assert "Failed requests:                         3" in text
    assert "     3 x generation failed: decode engine 1 died" in text and "no successful request" in text
    fig = cdf_figure(run)
    notes = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert len(notes) == 3 and all("no data: 3 of 3 requests failed" in n for n in notes)


def test_queue_full_is_retried_then_reported(fake_server) -> None:
    url, fake = fake_server
    fake.queue_full = True
    cfg = BenchConfig(url=url, num_agents=1, max_turns=1, max_retries_429=2)
    run = asyncio.run(run_bench(cfg))
    assert run.results[0].num_429 == 2 and "HTTP 429" in (run.results[0].error or "")


def test_request_timeout_fails_the_request_with_its_reason(fake_server) -> None:
    url, fake = fake_server
    fake.token_delay_s = 0.5
    cfg = BenchConfig(url=url, num_agents=2, max_turns=1, output_len=8, request_timeout_s=0.05)
    result = summarize(asyncio.run(run_bench(cfg)))
    assert result["failed"] == 2
    assert list(result["failure_reasons"]) == [
        "request timeout: no complete answer within 0.05 s (--request-timeout)"
    ]


def test_duration_limit_cancels_and_counts_unfinished(fake_server) -> None:
    url, fake = fake_server
    fake.token_delay_s = 0.05
    cfg = BenchConfig(url=url, num_agents=2, max_turns=3, duration_s=0.3)
    result = summarize(asyncio.run(run_bench(cfg)))
    assert result["agents_completed"] == 0 and result["duration"] < 5
    assert any("cancelled" in e for e in result["failure_reasons"])


def test_max_concurrency_caps_requests_in_flight(fake_server) -> None:
    url, fake = fake_server
    fake.token_delay_s = 0.01
    cfg = BenchConfig(
        url=url, dataset_name="random", num_prompts=4, input_len=8, output_len=3, max_concurrency=1
    )
    run = asyncio.run(run_bench(cfg))
    assert all(r.ok for r in run.results)
    spans = sorted((r.sent_s, r.sent_s + r.e2e_s) for r in run.results)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))  # one at a time
    assert summarize(run)["max_concurrent_requests"] == 1


def test_arrivals_like_vllm() -> None:
    assert arrival_times_s(3, math.inf) == [0.0, 0.0, 0.0]
    times = arrival_times_s(200, 4.0, seed=3)
    assert times == arrival_times_s(200, 4.0, seed=3) != arrival_times_s(200, 4.0, seed=4)
    assert all(b >= a for a, b in zip(times, times[1:]))
    assert times[-1] == pytest.approx(200 / 4.0)  # rescaled so the offered load is exact
    gaps = [b - a for a, b in zip([0.0, *times], times)]
    cv = float(__import__("numpy").std(gaps) / __import__("numpy").mean(gaps))
    assert 0.8 < cv < 1.2  # exponential gaps: coefficient of variation 1
    smooth = arrival_times_s(200, 4.0, burstiness=50.0, seed=3)
    sgaps = [b - a for a, b in zip([0.0, *smooth], smooth)]
    assert max(sgaps) < max(gaps)
    assert trace_times_s([5.0, 5.5, 7.0], time_scale=2.0) == [0.0, 0.25, 1.0]


def test_agents_fit_the_context_and_any_maxlen() -> None:
    agents = build_agents(BenchConfig(num_agents=5, maxlen=32768), context_len=1024)
    assert len(agents) == 5
    for a in agents:
        assert all(t.context_len <= 1024 for t in a.turns)
        assert all(t.cached_len == p.context_len for p, t in zip(a.turns, a.turns[1:]))
    tiny = build_agents(BenchConfig(num_agents=3, maxlen=64, output_len=2), context_len=4096)
    assert all(t.context_len <= 64 and t.gen_len == 2 for a in tiny for t in a.turns)
    assert max(len(a.turns) for a in tiny) > 1  # the calibrated bucket's turns, scaled down
    online = build_agents(BenchConfig(num_agents=4, maxlen=512, request_rate=2.0), 4096)
    assert [a.start_s for a in online] == arrival_times_s(4, 2.0)


def test_text_only_chunks_count_one_token_each() -> None:
    res = TurnResult(agent_index=0, turn_index=0, prompt_len=3, gen_len=2)
    _on_chunk({"choices": [{"text": "a"}]}, res, 0.1)
    _on_chunk({"choices": [{"text": "b"}]}, res, 0.3)
    _on_chunk({"choices": [], "usage": {"completion_tokens": 2}}, res, 0.3)
    res.end_s = 0.3
    assert res.token_ids is None and res.num_generated == 2
    assert res.ttft_s == 0.1 and res.tpot_s == pytest.approx(0.2)
    assert res.itls_s == [pytest.approx(0.2)]


@pytest.mark.parametrize(
    "kw",
    [
        {"url": "127.0.0.1:8000"},
        {"num_agents": 0},
        {"request_rate": 0},
        {"maxlen": 1},
        {"tpot_slo_s": -1},
        {"request_timeout_s": 0},
        {"dataset_name": "sharegpt"},
        {"dataset_name": "mooncake"},
        {"num_prompts": 5},
        {"max_concurrency": 0},
        {"percentile_metrics": "ttft,foo"},
        {"metric_percentiles": "0,101"},
        {"time_scale": 0},
    ],
)
def test_bad_config(kw) -> None:
    with pytest.raises(ConfigError):
        BenchConfig(**kw)

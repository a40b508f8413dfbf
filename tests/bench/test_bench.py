"""The agent benchmark client against our API (over the in-process fake cluster)."""

from __future__ import annotations

import asyncio
import json

import pytest

from dualpath.bench import BenchConfig, plot_cdfs, request_rows, run_bench, summarize
from dualpath.bench.agents import build_agents, start_times_s
from dualpath.bench.client import TurnResult, _on_chunk
from dualpath.core.errors import ConfigError


def test_two_agents_two_turns_replay_exact_contexts(fake_server, tmp_path) -> None:
    url, fake = fake_server
    cfg = BenchConfig(url=url, num_agents=2, maxlen=8192, max_turns=2, seed=1, ttft_slo_s=60,
                      tpot_slo_s=10)
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
        assert t2[len(t1): len(t1) + a.turns[0].gen_len] == res[0].token_ids
        assert len(t2) == len(t1) + a.turns[0].gen_len + a.turns[1].append_len
    summary = summarize(run)
    assert summary["num_ok"] == 4 and summary["num_failed"] == 0
    assert summary["num_agents_finished"] == 2 and summary["slo"]["attainment"] == 1.0
    assert summary["latency_s"]["ttft_s"]["count"] == 4 and summary["jct_s"]["count"] == 2
    assert summary["exact_token_ids"] is True
    json.dumps(summary)
    png = plot_cdfs(run, tmp_path / "cdf.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert len(request_rows(run)) == 4


def test_tight_slo_and_failures_count_against_attainment(fake_server) -> None:
    url, fake = fake_server
    fake.fail_after = 1
    cfg = BenchConfig(url=url, num_agents=2, max_turns=2, ttft_slo_s=1e-9, tpot_slo_s=1e-9)
    summary = summarize(asyncio.run(run_bench(cfg)))
    assert summary["num_failed"] == 2 and summary["num_requests"] == 2  # agents stop at a failure
    assert summary["slo"]["attainment"] == 0.0 and summary["num_agents_finished"] == 0
    assert any("decode engine 1 died" in e for e in summary["errors"])


def test_queue_full_is_retried_then_reported(fake_server) -> None:
    url, fake = fake_server
    fake.queue_full = True
    cfg = BenchConfig(url=url, num_agents=1, max_turns=1, max_retries_429=2)
    run = asyncio.run(run_bench(cfg))
    assert run.results[0].num_429 == 2 and "HTTP 429" in (run.results[0].error or "")


def test_duration_limit_cancels_and_counts_unfinished(fake_server) -> None:
    url, fake = fake_server
    fake.token_delay_s = 0.05
    cfg = BenchConfig(url=url, num_agents=2, max_turns=3, duration_s=0.3)
    summary = summarize(asyncio.run(run_bench(cfg)))
    assert summary["num_agents_finished"] == 0 and summary["wall_s"] < 5
    assert any("cancelled" in e for e in summary["errors"])


def test_online_arrivals_are_poisson_and_seeded() -> None:
    cfg = BenchConfig(num_agents=200, aps=4.0, seed=3)
    times = start_times_s(cfg)
    assert times == start_times_s(cfg) and times[0] == 0.0
    assert all(b >= a for a, b in zip(times, times[1:]))
    assert times[-1] / 199 == pytest.approx(0.25, rel=0.2)
    assert start_times_s(BenchConfig(num_agents=3)) == [0.0, 0.0, 0.0]


def test_agents_fit_the_context() -> None:
    agents = build_agents(BenchConfig(num_agents=5, maxlen=32768), context_len=1024)
    assert len(agents) == 5
    for a in agents:
        assert all(t.context_len <= 1024 for t in a.turns)
        assert all(t.cached_len == p.context_len for p, t in zip(a.turns, a.turns[1:]))


def test_text_only_chunks_count_one_token_each() -> None:
    res = TurnResult(agent_index=0, turn_index=0, prompt_len=3, gen_len=2)
    _on_chunk({"choices": [{"text": "a"}]}, res, 0.1)
    _on_chunk({"choices": [{"text": "b"}]}, res, 0.3)
    _on_chunk({"choices": [], "usage": {"completion_tokens": 2}}, res, 0.3)
    assert res.token_ids is None and res.num_generated == 2
    assert res.ttft_s == 0.1 and res.tpot_s == pytest.approx(0.2)


@pytest.mark.parametrize("kw", [{"url": "127.0.0.1:8000"}, {"num_agents": 0}, {"aps": 0},
                                {"maxlen": 100}, {"tpot_slo_s": -1}])
def test_bad_config(kw) -> None:
    with pytest.raises(ConfigError):
        BenchConfig(**kw)

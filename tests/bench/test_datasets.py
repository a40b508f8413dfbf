"""Request datasets (Mooncake trace replay, random) and the server cache counters; no server
except where the fake's ``submitted`` prompts are checked."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from dualpath.bench import BenchConfig, run_bench, summarize
from dualpath.bench.datasets import PromptBuilder, mooncake_requests, random_requests
from dualpath.bench.server_metrics import cache_hits, parse_counters
from dualpath.core.errors import ConfigError

# A few Mooncake records: r1 extends r0's two blocks; r2 shares only block 1 of r0; r3 shares none.
RECORDS = [
    {"timestamp": 1000, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]},
    {"timestamp": 1500, "input_length": 1300, "output_length": 20, "hash_ids": [1, 2, 3]},
    {"timestamp": 3000, "input_length": 600, "output_length": 5, "hash_ids": [1, 4]},
    {"timestamp": 3001, "input_length": 100, "output_length": 1, "hash_ids": [9]},
]


@pytest.fixture
def trace(tmp_path: Path) -> str:
    path = tmp_path / "mini_trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return str(path)


def _cfg(trace: str, **kw) -> BenchConfig:
    return BenchConfig(dataset_name="mooncake", dataset_path=trace, **kw)


def test_trace_timing_lengths_and_cut(trace: str) -> None:
    reqs = mooncake_requests(_cfg(trace), context_len=100_000)
    assert [r.arrival_s for r in reqs] == [0.0, 0.5, 2.0, 2.001]
    assert [(r.input_len, r.output_len) for r in reqs] == [(1000, 10), (1300, 20), (600, 5), (100, 1)]
    fast = mooncake_requests(_cfg(trace, time_scale=4.0, num_prompts=2), context_len=100_000)
    assert [r.arrival_s for r in fast] == [0.0, 0.125]
    poisson = mooncake_requests(_cfg(trace, request_rate=2.0), context_len=100_000)
    assert poisson[-1].arrival_s == pytest.approx(len(RECORDS) / 2.0)  # a rate replaces the timing


def test_shared_hash_prefixes_share_tokens(trace: str) -> None:
    cfg = _cfg(trace, seed=5)
    reqs = mooncake_requests(cfg, context_len=100_000)
    build = PromptBuilder(cfg, vocab_size=1000)
    p0, p1, p2, p3 = (build.prompt(r) for r in reqs)
    assert [len(p) for p in (p0, p1, p2, p3)] == [1000, 1300, 600, 100]
    assert p1[:1000] == p0  # all of r0's blocks (the partial second one too) are r1's prefix
    assert p2[:512] == p0[:512] and p2[512:600] != p0[512:600]  # block 1 shared, block 4 not
    assert p3 != p0[:100]
    again = PromptBuilder(cfg, vocab_size=1000)  # deterministic from (seed, hash id)
    assert again.prompt(reqs[1]) == p1
    assert PromptBuilder(_cfg(trace, seed=6), 1000).prompt(reqs[0]) != p0
    assert all(16 <= t < 1000 for t in p1)


def test_block_len_sizes_the_trace_down_and_context_cuts_keep_prefixes(trace: str) -> None:
    cfg = _cfg(trace, block_len=16)
    small = mooncake_requests(cfg, context_len=100_000)
    # 512-token blocks -> 16 tokens: 1000 = 512 + 488 -> 16 + 15; outputs scaled the same way
    assert [(r.input_len, r.output_len) for r in small] == [(31, 1), (41, 1), (19, 1), (3, 1)]
    build = PromptBuilder(cfg, vocab_size=500)
    p0, p1 = build.prompt(small[0]), build.prompt(small[1])
    assert p1[:31] == p0
    cut = mooncake_requests(_cfg(trace), context_len=800)
    assert [r.truncated for r in cut] == [True, True, False, False]
    assert all(r.input_len + r.output_len <= 800 for r in cut)
    b = PromptBuilder(_cfg(trace), 1000)
    assert [r.input_len for r in cut[:2]] == [790, 780]  # output kept, prompt's tail dropped
    assert b.prompt(cut[0])[:780] == b.prompt(cut[1])


def test_bad_trace_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n" + '{"timestamp": 1, "input_length": 600}\n')
    with pytest.raises(ConfigError, match="bad.jsonl:2"):
        mooncake_requests(_cfg(str(path)), context_len=4096)


def test_random_dataset_sizes_and_context_check() -> None:
    cfg = BenchConfig(dataset_name="random", num_prompts=3, input_len=10, output_len=4, seed=2)
    reqs = random_requests(cfg, context_len=64)
    assert [(r.input_len, r.output_len, r.arrival_s) for r in reqs] == [(10, 4, 0.0)] * 3
    build = PromptBuilder(cfg, 300)
    assert build.prompt(reqs[0]) != build.prompt(reqs[1]) and len(build.prompt(reqs[2])) == 10
    with pytest.raises(ConfigError, match="exceeds the endpoint's context of 12"):
        random_requests(cfg, context_len=12)


def test_trace_replay_sends_on_schedule_with_shared_prefixes(fake_server, trace: str) -> None:
    url, fake = fake_server
    cfg = _cfg(trace, url=url, time_scale=10.0, block_len=64, max_context_len=2048)
    run = asyncio.run(run_bench(cfg))
    assert all(r.ok for r in run.results)
    for spec, res in zip(run.requests, run.results):
        assert res.sent_s >= spec.arrival_s  # never early
    by_len = {len(p): p for p, _ in fake.submitted}
    first, second = by_len[run.requests[0].input_len], by_len[run.requests[1].input_len]
    assert second[: len(first)] == first
    result = summarize(run)
    assert result["dataset_name"] == "mooncake" and result["mode"] == "trace-timed"
    assert result["completed"] == 4 and result["num_agents"] is None
    assert "mean_jct_ms" not in result


def test_prometheus_counters_and_hit_rate() -> None:
    text = (
        '# HELP dualpath_store_hit_tokens_total x\n# TYPE dualpath_store_hit_tokens_total counter\n'
        'dualpath_store_hit_tokens_total 100.0\ndualpath_prompt_tokens_total 400.0\n'
        'vllm:prefix_cache_hits_total{model_name="a b"} 3\n'
        'vllm:prefix_cache_hits_total{model_name="c"} 4\n'
    )
    before = parse_counters(text)
    assert before["vllm:prefix_cache_hits_total"] == 7.0
    after = dict(before, dualpath_store_hit_tokens_total=400.0, dualpath_prompt_tokens_total=1000.0)
    hits = cache_hits(before, after)
    assert hits is not None and hits.source == "dualpath" and hits.hit_rate == pytest.approx(0.5)
    assert cache_hits(None, after) is None
    assert cache_hits({"x": 1.0}, {"x": 2.0}) is None
    assert cache_hits(before, before).hit_rate is None  # nothing queried during the run

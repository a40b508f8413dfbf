"""A 1P1D cluster whose PE batches by a small compute quota (fixed predictor line, so the chunks are
deterministic): every prompt is prefilled in several chunks, tokens still equal a single-process
greedy forward."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from dualpath.policy import BatchItem, BatchView, SchedulerConfig, make_scheduler
from dualpath.runtime.cluster.api import SamplingParams
from dualpath.runtime.cluster.config import ClusterConfig, EngineConfig
from dualpath.runtime.cluster.local import LocalCluster
from dualpath.runtime.engine.profile import fixed_predictor
from dualpath.runtime.model import load_decoder

from .conftest import generate, tiny_dir
from .test_local_cluster import _reference

QUOTA_MS, S_PER_GFLOP = 5.0, 1.0


@pytest.fixture(scope="module")
def quota_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cfg = ClusterConfig(
        kv_dir=str(tmp_path_factory.mktemp("kv")),
        model="tiny",
        num_prefill_engines=1,
        num_decode_engines=1,
        engine=EngineConfig(
            compute_quota_s=QUOTA_MS / 1e3, attention_s_per_gflop=S_PER_GFLOP, heartbeat_s=0.1
        ),
    )
    with LocalCluster(cfg) as c:
        yield c


def test_small_quota_chunks_every_prompt_and_tokens_stay_exact(quota_cluster: LocalCluster) -> None:
    log = (quota_cluster.run_dir / "engine0.log").read_text()
    assert "attention predictor (fixed): 1.0000 s/GFLOP" in log and "quota 5 ms" in log
    # what this PE's policy does with a lone 150-token prompt: a chunk, not the whole prompt
    dec, _ = load_decoder(str(tiny_dir(quota_cluster)), device="cpu")
    cfg = SchedulerConfig(
        compute_quota_s=QUOTA_MS / 1e3,
        attention_predictor=fixed_predictor(dec, seconds_per_gflop=S_PER_GFLOP),
    )
    plan = make_scheduler("dualpath", cfg).plan_prefill_batch(
        BatchView(now_s=0.0, engine_id=0, waiting=(BatchItem(request_id="r", cached_len=0, new_len=150),))
    )
    assert 0 < plan.entries[0].chunk_len < 150
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 512) for _ in range(150 + 23 * i)] for i in range(3)]
    results = generate(quota_cluster.address, prompts, SamplingParams(max_tokens=5, ignore_eos=True))
    for prompt, events in zip(prompts, results, strict=True):
        assert [e.token_id for e in events] == _reference(quota_cluster, prompt, 5)

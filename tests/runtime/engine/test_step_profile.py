"""The engine profiler (runtime/engine/step_profile.py): it times the real engines into a valid
profile that round-trips and that the simulator's local cluster runs on."""

from __future__ import annotations

import torch

from dualpath.runtime.engine.step_profile import profile_engine
from dualpath.spec.engine_profile import EngineProfile


def test_the_profiler_measures_a_valid_profile_of_the_real_engine(tiny_llama, tmp_path) -> None:
    decoder, _hf = tiny_llama
    threads = torch.get_num_threads()
    profile = profile_engine(
        decoder,
        model="tiny-test",
        cached_lens=(0, 256),
        new_lens=(1, 16, 64, 512),
        batches=(1, 4),
        contexts=(64, 1024),
        join_lens=(64, 1024),
        batch_checks=(((0, 100), (0, 200)),),
        repeats=1,
    )
    assert torch.get_num_threads() == threads  # (restored after the one-thread profile)
    assert profile.clock == "thread_cpu" and profile.cpu_cores >= 1 and profile.torch_threads == 1
    assert profile.num_layers == decoder.num_layers and profile.block_size == 64
    assert profile.max_context_len == decoder.config.max_position_embeddings > 0  # (the KV pools)
    assert len(profile.prefill) == 8 and len(profile.decode) == 4 and len(profile.join) == 2
    assert all(p.seconds > 0 for p in (*profile.prefill, *profile.decode, *profile.join))
    step = {(p.cached_len, p.new_len): p.seconds for p in profile.prefill}
    assert step[(0, 512)] > step[(0, 1)]  # more new tokens, more compute
    assert profile.attention_s_per_gflop > 0 and profile.prefill_request_s >= 0
    assert profile.batches[0].entries == ((0, 100), (0, 200)) and profile.batches[0].seconds > 0
    path = tmp_path / "profile.json"
    profile.save(path)
    assert EngineProfile.load(path) == profile

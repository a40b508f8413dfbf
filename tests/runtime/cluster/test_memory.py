"""Engine memory: the ``--kv-cache-memory`` budget, its split into pools, the shared packed weights,
and, on a real local cluster, a request that cannot fit refused with a clear error (issue 31)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from dualpath.core.errors import ConfigError
from dualpath.runtime.cluster.memory import (
    AUTO_POOL_BYTES,
    check_fits,
    parse_memory,
    resolve_memory,
    size_pools,
)

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("512MiB", (512 << 20, 0.0)),
        ("2GB", (2_000_000_000, 0.0)),
        ("1.5GiB", (int(1.5 * 2**30), 0.0)),
        ("1073741824", (1 << 30, 0.0)),
        ("0.25", (0, 0.25)),
        ("1", (0, 1.0)),
        ("auto", (0, 0.0)),
    ],
)
def test_budget_spellings(spec: str, want: tuple[int, float]) -> None:
    assert parse_memory(spec) == want


@pytest.mark.parametrize("spec", ["lots", "-1", "0", "12 parsecs", "0B"])
def test_a_bad_budget_names_itself(spec: str) -> None:
    with pytest.raises(ConfigError, match="kv_cache_memory") as err:
        parse_memory(spec)
    assert spec in str(err.value)


def test_auto_is_a_gib_or_less_for_small_models() -> None:
    assert resolve_memory("auto", 46_080) == AUTO_POOL_BYTES  # SmolLM2-135M fp32: 46,080 B/token
    assert resolve_memory("auto", 2048) == 65536 * 2048  # the tiny model: 65,536 tokens' KV
    assert resolve_memory("0.5", 1) > 0


def test_more_than_the_machine_has_is_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match="exceed the .* GiB of memory available"):
        check_fits("64TiB", 3)


def test_the_pools_stay_inside_the_budget_and_say_what_they_hold() -> None:
    block_bytes, bs, layers = 64 * 46_080, 64, 30  # SmolLM2-135M fp32 Full Blocks
    de = size_pools(
        "decode", 1 << 30, block_size=bs, block_bytes=block_bytes, num_layers=layers, max_context=8192
    )
    pe = size_pools(
        "prefill", 1 << 30, block_size=bs, block_bytes=block_bytes, num_layers=layers, max_context=8192
    )
    for p in (de, pe):
        assert p.total_bytes <= 1 << 30 and p.total_bytes > 0.95 * (1 << 30)
    assert de.max_context_tokens >= 8192 and de.max_prompt_tokens >= 8192  # the full context fits
    assert pe.max_prompt_tokens >= 8192 and pe.staging_tokens >= 8192
    with pytest.raises(ConfigError, match="at least"):
        size_pools(
            "decode", block_bytes, block_size=bs, block_bytes=block_bytes, num_layers=layers, max_context=8192
        )


def test_packed_weights_are_mapped_and_bit_identical(tmp_path: Path) -> None:
    """Two "engines" of one host: the first converts and writes the file, both map it; the
    forward is bit-identical to the decoder built from the checkpoint."""
    from dualpath.runtime.model import load_decoder
    from dualpath.runtime.model.packed import shared_decoder, weights_bytes
    from dualpath.runtime.model.tiny import TinySpec, make_tiny_checkpoint

    make_tiny_checkpoint(tmp_path / "m", TinySpec())
    own, _ = load_decoder(str(tmp_path / "m"), device="cpu")
    builds: list[int] = []

    def build() -> tuple[object, dict[str, object]]:
        builds.append(1)
        return load_decoder(str(tmp_path / "m"), device="cpu")[0], {"eos_token_id": 2}

    a, extra_a = shared_decoder(tmp_path, "k", build)  # type: ignore[arg-type]
    b, extra_b = shared_decoder(tmp_path, "k", build)  # type: ignore[arg-type]
    assert builds == [1] and extra_a == extra_b == {"eos_token_id": 2}
    ids = list(range(3, 60))
    with torch.inference_mode():
        want = own.forward_full(ids)
        assert torch.equal(a.forward_full(ids), want) and torch.equal(b.forward_full(ids), want)
    assert weights_bytes(a) == weights_bytes(own)
    # the tensors are views of one file mapping, not copies
    assert a._embed.untyped_storage().data_ptr() == a._norm.untyped_storage().data_ptr()


def test_a_request_that_cannot_fit_is_refused_clearly(tmp_path: Path) -> None:
    """A tiny-model 1P1D cluster with 2 MiB of KV per engine (512 tokens of the tiny model's
    128 KiB blocks): /health reports each engine's memory, the cluster's context is what the
    decode engine's cache holds, a prompt or a context beyond it is refused at once with the
    reason (before: it waited for buffer room that never came), and one that fits is served."""
    from dualpath.runtime.cluster.api import ContextTooLongError, SamplingParams
    from dualpath.runtime.cluster.client import ClusterClient
    from dualpath.runtime.cluster.config import ClusterConfig, EngineConfig
    from dualpath.runtime.cluster.local import LocalCluster

    cfg = ClusterConfig(kv_dir=str(tmp_path / "kv"), model="tiny", num_decode_engines=1,
                        engine=EngineConfig(kv_cache_memory="2MiB"))  # fmt: skip
    with LocalCluster(cfg, supervise=False) as cluster:
        h = cluster.health()
        assert h is not None
        for e in h.engines:
            assert e.state == "ready" and 0 < e.kv_pool_bytes <= 2 << 20 and e.weights_bytes > 0, e
            assert e.rss_bytes > e.kv_pool_bytes and e.pid > 0
        de = next(e for e in h.engines if e.role == "decode")
        assert de.max_context_tokens == 512

        async def main() -> None:
            async with ClusterClient(cluster.address) as client:
                info = await client.info()
                assert info.max_context_len == 512
                with pytest.raises(ContextTooLongError, match="raise --kv-cache-memory"):
                    async for _ in client.generate([5] * 600, SamplingParams(max_tokens=4)):
                        pass
                with pytest.raises(ContextTooLongError, match="decode engine's KV cache holds"):
                    async for _ in client.generate([5] * 400, SamplingParams(max_tokens=200)):
                        pass
                events = [
                    ev
                    async for ev in client.generate([5] * 300, SamplingParams(max_tokens=8, ignore_eos=True))
                ]
                assert events[-1].finish_reason == "length" and len(events) == 8

        asyncio.run(asyncio.wait_for(main(), 120))

"""The engine profile (spec/engine_profile.py) and its cost model (cost/profile.py, sim ProfileCosts):
the file round-trips, bad files are named errors, and simulated step times equal the profile's at
its points and interpolate between them."""

from __future__ import annotations

import itertools

import pytest

from dualpath.core.errors import ConfigError
from dualpath.cost.profile import ProfileTimes
from dualpath.sim.costs import ProfileCosts
from dualpath.sim.local import LOCAL_CALIBRATION
from dualpath.spec.engine_profile import BatchPoint, DecodePoint, EngineProfile, JoinPoint, PrefillPoint

CACHED, NEW = (0, 256, 1024), (1, 64, 512)
BATCH, CTX = (1, 4), (64, 1024)


def _prefill_s(c: int, n: int) -> float:
    return 0.01 + 0.002 * n + 1e-6 * c * n  # a made-up engine: linear layers + attention


def make_profile(**kw) -> EngineProfile:
    fields = dict(
        model="test",
        dtype="float32",
        num_layers=30,
        num_heads=9,
        head_dim=64,
        kv_bytes_per_token=46_080,
        block_size=64,
        torch_threads=1,
        clock="thread_cpu",
        cpu_cores=2,
        attention_s_per_gflop=0.011,
        attention_intercept_s=0.0027,
        prefill=tuple(
            PrefillPoint(cached_len=c, new_len=n, seconds=_prefill_s(c, n))
            for c, n in itertools.product(CACHED, NEW)
        ),
        decode=tuple(
            DecodePoint(batch=b, context_len=x, seconds=0.05 + 0.01 * b + 1e-5 * b * x)
            for b, x in itertools.product(BATCH, CTX)
        ),
        join=(JoinPoint(prompt_len=64, seconds=0.004), JoinPoint(prompt_len=1024, seconds=0.02)),
        batches=(BatchPoint(entries=((0, 300), (0, 400)), seconds=1.5),),
    )
    fields.update(kw)
    return EngineProfile(**fields)


def test_profile_round_trips(tmp_path) -> None:
    p = make_profile()
    path = tmp_path / "profile.json"
    p.save(path)
    assert EngineProfile.load(path) == p
    p.save(path)  # a second save of the loaded copy is byte-identical
    first = path.read_bytes()
    EngineProfile.load(path).save(path)
    assert path.read_bytes() == first


def test_simulated_step_times_equal_the_profile_at_its_points() -> None:
    p = make_profile()
    costs = ProfileCosts(p, LOCAL_CALIBRATION)
    for pt in p.prefill:
        layer = costs.attention_layer_s([(pt.cached_len, pt.new_len)]) + costs.other_layer_s(pt.new_len)
        assert costs.iteration_s(layer) == pytest.approx(pt.seconds, rel=1e-12)
    for pt in p.decode:
        ctx_sum = pt.batch * pt.context_len
        assert costs.decode_step_s(pt.batch, ctx_sum) == pytest.approx(pt.seconds, rel=1e-12)
    for pt in p.join:
        assert costs.join_stall_s(pt.prompt_len) == pytest.approx(pt.seconds, rel=1e-12)


def test_step_times_interpolate_between_points_and_batch_by_the_rule() -> None:
    t = ProfileTimes(make_profile())
    # bilinear inside the grid: the made-up engine is bilinear in (c, n) on each cell
    assert t.prefill_s([(128, 32)]) == pytest.approx(_prefill_s(128, 32), rel=1e-9)
    assert t.prefill_s([(640, 300)]) == pytest.approx(_prefill_s(640, 300), rel=1e-9)
    # linear beyond the grid's last points
    assert t.prefill_s([(2048, 512)]) == pytest.approx(_prefill_s(2048, 512), rel=1e-9)
    # a batch: the zero-cache step of all its tokens plus what each cached prefix adds
    entries = [(256, 64), (1024, 1)]
    want = _prefill_s(0, 65) + sum(_prefill_s(c, n) - _prefill_s(0, n) for c, n in entries)
    assert t.prefill_s(entries) == pytest.approx(want, rel=1e-9)
    assert t.prefill_s([]) == 0.0
    assert t.decode_step_s(2, 544) == pytest.approx(0.05 + 0.02 + 1e-5 * 2 * 544, rel=1e-9)
    assert t.join_s(544) == pytest.approx(0.004 + 0.016 * 480 / 960, rel=1e-9)


def test_each_request_beyond_the_first_adds_the_measured_request_cost() -> None:
    p = make_profile(prefill_request_s=0.01)
    entries = [(256, 64), (1024, 1), (0, 64)]
    base = ProfileTimes(make_profile()).prefill_s(entries)
    assert ProfileTimes(p).prefill_s(entries) == pytest.approx(base + 2 * 0.01, rel=1e-12)
    assert ProfileTimes(p).prefill_s([(256, 64)]) == ProfileTimes(make_profile()).prefill_s([(256, 64)])
    costs = ProfileCosts(p, LOCAL_CALIBRATION)
    layer = costs.attention_layer_s(entries) + costs.other_layer_s(129)
    assert costs.iteration_s(layer) == pytest.approx(base + 0.02, rel=1e-12)


def test_the_quota_batcher_gets_the_profiled_attention_line() -> None:
    p = make_profile()
    pred = ProfileCosts(p, LOCAL_CALIBRATION).predictor
    flops = pred.attention_flops(512, 100)
    assert flops == 2.0 * 9 * (64 + 64) * (512 * 100 + 100 * 101 // 2)  # the engine's AttentionFlops
    per_layer = p.attention_intercept_s / 30 + p.attention_s_per_gflop / 1e9 * flops
    assert pred.predict_s(flops) == pytest.approx(per_layer, rel=1e-12)


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"prefill": make_profile().prefill[:-1]}, "fill the 3 x 3 grid"),
        ({"prefill": tuple(q for q in make_profile().prefill if q.cached_len)}, "cached_len 0"),
        ({"decode": (DecodePoint(batch=0, context_len=64, seconds=0.1),)}, "axes start"),
        ({"attention_s_per_gflop": 0.0}, "attention_s_per_gflop"),
        ({"format": 2}, "format"),
    ],
)
def test_a_bad_profile_names_what_is_wrong(change, names) -> None:
    with pytest.raises(ConfigError, match=names):
        make_profile(**change)


def test_a_missing_or_malformed_file_is_a_named_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        EngineProfile.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "x"}')
    with pytest.raises(ConfigError, match="not an engine profile"):
        EngineProfile.load(bad)

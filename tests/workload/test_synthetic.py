"""Synthetic generator: Table 2 statistics within 5%, determinism, statistic definitions."""

from __future__ import annotations

import pytest

from dualpath.core.errors import ConfigError
from dualpath.workload import (
    STAT_COLUMNS,
    TABLE2,
    Trajectory,
    Turn,
    compare_to_table2,
    generate_trajectories,
    params_for,
    resolve_maxlen,
    workload_stats,
)


@pytest.mark.parametrize("maxlen", ["32k", "48k", "64k"])
@pytest.mark.parametrize("seed", [0, 1])
def test_statistics_match_table2_within_5_percent(maxlen: str, seed: int) -> None:
    bucket = resolve_maxlen(maxlen)
    trajs = generate_trajectories(bucket, 500, seed)
    assert len(trajs) == 500
    errors = compare_to_table2(workload_stats(trajs), bucket)
    assert set(errors) == set(STAT_COLUMNS)
    bad = {k: round(v, 4) for k, v in errors.items() if abs(v) > 0.05}
    assert not bad, f"{maxlen} seed {seed}: {bad}"
    assert max(t.final_len for t in trajs) <= bucket


def test_same_seed_same_trajectories_other_seed_differs() -> None:
    a = generate_trajectories(32768, 50, 3)
    assert a == generate_trajectories("32k", 50, 3)
    b = generate_trajectories(32768, 50, 4)
    assert a != b
    assert [t.traj_id for t in a][:2] == ["syn32k-3-0", "syn32k-3-1"]


def test_trajectories_are_multi_turn_with_a_long_first_prompt() -> None:
    trajs = generate_trajectories(65536, 100, 0)
    assert all(t.num_turns >= 2 for t in trajs)
    first = sum(t.turns[0].append_len for t in trajs) / len(trajs)
    later = sum(t.turns[1].append_len for t in trajs) / len(trajs)
    assert first > 10 * later  # the task prompt dominates the first turn


def test_workload_stats_hand_computed() -> None:
    a = Trajectory(
        "a",
        (Turn(append_len=100, gen_len=10), Turn(append_len=20, gen_len=5), Turn(append_len=30, gen_len=5)),
    )  # prompts 100, 130, 165
    b = Trajectory("b", (Turn(append_len=50, gen_len=2),))  # prompt 50
    s = workload_stats([a, b])
    assert s["num_trajectories"] == 2 and s["total_turns"] == 4
    assert s["turns"] == pytest.approx(2.0)
    assert s["append_per_turn"] == pytest.approx((50 + 50) / 2)
    assert s["gen_per_turn"] == pytest.approx((20 / 3 + 2) / 2)
    assert s["final_len"] == pytest.approx((170 + 52) / 2)
    assert s["context_len"] == pytest.approx((395 / 3 + 50) / 2)
    assert s["hit_rate"] == pytest.approx(1 - 50 / ((395 / 3 + 50) / 2))
    assert s["hit_rate_tokens"] == pytest.approx(1 - 200 / 445)
    assert s["max_final_len"] == 170


def test_table2_hit_rate_is_the_papers() -> None:
    assert TABLE2[65536]["hit_rate"] == pytest.approx(0.987, abs=5e-4)


def test_other_maxlen_interpolates_and_respects_the_limit() -> None:
    p = params_for(40960)
    lo, hi = params_for(32768), params_for(49152)
    assert min(lo.append_mean, hi.append_mean) <= p.append_mean <= max(lo.append_mean, hi.append_mean)
    trajs = generate_trajectories(40960, 100, 0)
    assert max(t.final_len for t in trajs) <= 40960
    s = workload_stats(trajs)
    assert TABLE2[32768]["turns"] < s["turns"] < TABLE2[49152]["turns"] * 1.1


@pytest.mark.parametrize("maxlen,num,seed", [(100, 10, 0), ("abc", 10, 0), (65536, 0, 0), (65536, 10, -1)])
def test_bad_arguments(maxlen: object, num: int, seed: int) -> None:
    with pytest.raises(ConfigError):
        generate_trajectories(maxlen, num, seed)  # type: ignore[arg-type]


def test_stats_reject_empty_and_unknown_bucket() -> None:
    with pytest.raises(ConfigError):
        workload_stats([])
    with pytest.raises(ConfigError, match="maxlen"):
        compare_to_table2({}, 12345)

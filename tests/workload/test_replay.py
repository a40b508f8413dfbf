"""Replay semantics (spec section 9): turn requests, cloning, scaling, truncation."""

from __future__ import annotations

import pytest

from dualpath.core.errors import ConfigError
from dualpath.workload import (
    SYNTHETIC_PREFIX_LEN,
    ReplayConfig,
    Trajectory,
    Turn,
    expand_agents,
    iter_turn_requests,
    scale_turns,
    truncate,
)


def make_trajectory(
    traj_id: str = "t", turns: tuple[tuple[int, int], ...] = ((100, 10), (20, 5), (30, 5))
) -> Trajectory:
    return Trajectory(traj_id, tuple(Turn(append_len=a, gen_len=g) for a, g in turns))


def test_turn_requests_chain_contexts() -> None:
    reqs = list(iter_turn_requests(make_trajectory()))
    assert [(r.turn_index, r.cached_len, r.append_len, r.prompt_len, r.gen_len) for r in reqs] == [
        (0, 0, 100, 100, 10),
        (1, 110, 20, 130, 5),
        (2, 135, 30, 165, 5),
    ]
    assert [r.context_len for r in reqs] == [110, 135, 170]
    for prev, nxt in zip(reqs, reqs[1:]):
        assert nxt.cached_len == prev.context_len
    assert make_trajectory().final_len == reqs[-1].context_len


def test_tool_latency_only_between_turns() -> None:
    reqs = list(iter_turn_requests(make_trajectory(), tool_latency_s=2.5))
    assert [r.tool_latency_s for r in reqs] == [0.0, 2.5, 2.5]
    assert all(r.tool_latency_s == 0.0 for r in iter_turn_requests(make_trajectory()))


def test_types_reject_bad_values() -> None:
    with pytest.raises(ConfigError, match="gen_len"):
        Turn(append_len=5, gen_len=0)
    with pytest.raises(ConfigError, match="append_len"):
        Turn(append_len=-1, gen_len=1)
    with pytest.raises(ConfigError, match="turns"):
        Trajectory("x", ())
    with pytest.raises(ConfigError, match="first turn"):
        Trajectory("x", (Turn(append_len=0, gen_len=3),))
    with pytest.raises(ConfigError, match="num_agents"):
        ReplayConfig(num_agents=0)
    with pytest.raises(ConfigError, match="append_scale"):
        ReplayConfig(num_agents=1, append_scale=0)
    with pytest.raises(ConfigError, match="tool_latency_s"):
        ReplayConfig(num_agents=1, tool_latency_s=-1.0)


def test_fewer_agents_take_the_first_trajectories() -> None:
    trajs = [make_trajectory(f"t{i}") for i in range(5)]
    out = expand_agents(trajs, ReplayConfig(num_agents=3))
    assert [t.traj_id for t in out] == ["t0", "t1", "t2"]
    assert out[0] is trajs[0]


def test_more_agents_clone_with_synthetic_first_turn() -> None:
    trajs = [make_trajectory(f"t{i}", ((100 + i, 10), (20, 5))) for i in range(3)]
    out = expand_agents(trajs, ReplayConfig(num_agents=10, seed=7))
    assert len(out) == 10 and out[:3] == trajs
    clones = out[3:]
    assert [c.traj_id.split("#")[1] for c in clones] == [f"c{k}" for k in range(7)]
    assert len({c.traj_id for c in out}) == 10
    for clone in clones:
        parent = next(t for t in trajs if t.traj_id == clone.parent_id)
        assert clone.traj_id.startswith(parent.traj_id + "#")
        assert clone.turns[0] == Turn(append_len=SYNTHETIC_PREFIX_LEN, gen_len=1)
        assert clone.turns[1:] == parent.turns
        first_real = list(iter_turn_requests(clone))[1]
        assert first_real.cached_len == SYNTHETIC_PREFIX_LEN + 1
    # seeded: same seed, same parents; another seed, different choice somewhere
    again = expand_agents(trajs, ReplayConfig(num_agents=10, seed=7))
    assert again == out
    other = [expand_agents(trajs, ReplayConfig(num_agents=10, seed=s)) for s in range(8, 12)]
    assert any([c.parent_id for c in o[3:]] != [c.parent_id for c in clones] for o in other)


def test_prefix_length_is_configurable() -> None:
    out = expand_agents([make_trajectory()], ReplayConfig(num_agents=2, synthetic_prefix_len=512))
    assert out[1].turns[0] == Turn(append_len=512, gen_len=1)


def test_scaling_rounds_and_skips_the_synthetic_turn() -> None:
    traj = make_trajectory()
    doubled = scale_turns(traj, 2.0, 0.5)
    assert [(t.append_len, t.gen_len) for t in doubled.turns] == [(200, 5), (40, 2), (60, 2)]
    tiny = scale_turns(traj, 0.001, 0.001)
    assert all(t.append_len == 1 and t.gen_len == 1 for t in tiny.turns)
    out = expand_agents([traj], ReplayConfig(num_agents=2, append_scale=3.0))
    assert out[0].turns[1].append_len == 60
    assert out[1].turns[0] == Turn(append_len=SYNTHETIC_PREFIX_LEN, gen_len=1)
    assert out[1].turns[1].append_len == 300


def test_truncation_at_max_len() -> None:
    traj = make_trajectory()  # contexts 110, 135, 170
    assert truncate(traj, 170) is traj
    assert [t.append_len for t in truncate(traj, 169).turns] == [100, 20]
    assert [t.append_len for t in truncate(traj, 134).turns] == [100]
    lone = truncate(traj, 50)
    assert lone.num_turns == 1 and lone.final_len == 50 and lone.turns[0].gen_len == 10
    single = truncate(make_trajectory("s", ((1, 64),)), 64)  # one turn, one token over
    assert single.final_len == 64 and single.turns[0] == Turn(append_len=32, gen_len=32)
    out = expand_agents([traj], ReplayConfig(num_agents=1, append_scale=4.0, max_len=500))
    assert out[0].final_len <= 500
    assert [t.append_len for t in out[0].turns] == [400, 80]


def test_expand_rejects_empty_input() -> None:
    with pytest.raises(ConfigError, match="trajectories"):
        expand_agents([], ReplayConfig(num_agents=3))


def test_poisson_arrivals() -> None:
    from dualpath.workload import with_poisson_arrivals

    trajs = [make_trajectory(f"t{i}") for i in range(4000)]
    out = with_poisson_arrivals(trajs, rate_aps=0.5, seed=3)
    arrivals = [t.arrival_s for t in out]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0
    assert arrivals[-1] / len(out) == pytest.approx(2.0, rel=0.05)  # mean gap 1 / rate
    assert [t.turns for t in out] == [t.turns for t in trajs]
    assert with_poisson_arrivals(trajs, 0.5, seed=3) == out
    with pytest.raises(ConfigError, match="rate_aps"):
        with_poisson_arrivals(trajs, 0.0)


def test_numpy_integers_are_stored_as_ints() -> None:
    import numpy as np

    turn = Turn(append_len=np.int64(7), gen_len=np.int32(2))
    assert type(turn.append_len) is int and type(turn.gen_len) is int and turn == Turn(7, 2)
    with pytest.raises(ConfigError, match="must be an int"):
        Turn(append_len=2.5, gen_len=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be an int"):
        Turn(append_len=True, gen_len=1)

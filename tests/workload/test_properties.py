"""Property tests of replay (hypothesis) and a short calibration run."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.workload import (
    BUCKET_PARAMS,
    ReplayConfig,
    Trajectory,
    Turn,
    expand_agents,
    iter_turn_requests,
)
from dualpath.workload.calibrate import fit_params

turns = st.lists(st.tuples(st.integers(1, 5000), st.integers(1, 500)), min_size=1, max_size=12)
trajectories = st.lists(turns, min_size=1, max_size=6).map(
    lambda ts: [
        Trajectory(f"t{i}", tuple(Turn(append_len=a, gen_len=g) for a, g in t)) for i, t in enumerate(ts)
    ]
)


@settings(max_examples=60, deadline=None)
@given(
    trajs=trajectories,
    num_agents=st.integers(1, 20),
    seed=st.integers(0, 10**6),
    append_scale=st.floats(0.1, 4.0),
    gen_scale=st.floats(0.1, 4.0),
    max_len=st.none() | st.integers(64, 20000),
)
def test_expand_agents_invariants(
    trajs: list[Trajectory],
    num_agents: int,
    seed: int,
    append_scale: float,
    gen_scale: float,
    max_len: int | None,
) -> None:
    cfg = ReplayConfig(
        num_agents=num_agents, seed=seed, append_scale=append_scale, gen_scale=gen_scale, max_len=max_len
    )
    out = expand_agents(trajs, cfg)
    assert len(out) == num_agents
    assert len({t.traj_id for t in out}) == num_agents
    assert out == expand_agents(trajs, cfg)
    for traj in out:
        if max_len is not None:
            assert traj.final_len <= max_len
        reqs = list(iter_turn_requests(traj))
        assert reqs[0].cached_len == 0
        assert all(b.cached_len == a.context_len for a, b in zip(reqs, reqs[1:]))
        assert reqs[-1].context_len == traj.final_len


def test_fit_params_recovers_from_a_perturbed_start() -> None:
    start = replace(BUCKET_PARAMS[32768], append_mean=BUCKET_PARAMS[32768].append_mean * 1.3, traj_sigma=0.6)
    fitted, errors = fit_params(32768, num=300, iterations=4, start=start)
    assert max(abs(e) for e in errors.values()) < 0.03, errors
    assert abs(fitted.append_mean / BUCKET_PARAMS[32768].append_mean - 1) < 0.2

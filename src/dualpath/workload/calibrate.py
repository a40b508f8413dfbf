"""Fit ``SyntheticParams`` so generated trajectories hit target Table 2 statistics.

Used once to produce ``BUCKET_PARAMS`` (the fitted numbers are hard-coded there); kept so a user can
fit the generator to their own trace statistics. Damped Newton iteration in log space with a
finite-difference Jacobian; common random numbers (a fixed seed) keep the objective smooth.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dualpath.workload.stats import TABLE2, workload_stats
from dualpath.workload.synthetic import SyntheticParams, generate_trajectories, params_for

FIT_FIELDS = ("final_shape", "first_append", "append_mean", "gen_mean", "traj_sigma")
FIT_STATS = ("final_len", "context_len", "append_per_turn", "gen_per_turn", "turns")


def _to_vec(p: SyntheticParams) -> np.ndarray:
    return np.log([getattr(p, f) for f in FIT_FIELDS])


def _from_vec(v: np.ndarray) -> SyntheticParams:
    values = dict(zip(FIT_FIELDS, np.exp(v).tolist(), strict=True))
    values["traj_sigma"] = min(values["traj_sigma"], 3.0)
    return SyntheticParams(**values)


def _evaluate(v: np.ndarray, maxlen: int, num: int, seed: int) -> np.ndarray:
    stats = workload_stats(generate_trajectories(maxlen, num, seed, params=_from_vec(v)))
    return np.log([stats[s] for s in FIT_STATS])


def fit_params(
    maxlen: int,
    targets: Mapping[str, float] | None = None,
    *,
    num: int = 2000,
    seed: int = 0,
    iterations: int = 12,
    tol: float = 0.002,
    start: SyntheticParams | None = None,
) -> tuple[SyntheticParams, dict[str, float]]:
    """Return fitted parameters and the relative error per fitted statistic at (num, seed).

    ``targets`` defaults to the Table 2 row of ``maxlen``; it needs the keys of ``FIT_STATS``."""
    goal_map = TABLE2[maxlen] if targets is None else targets
    goal = np.log([goal_map[s] for s in FIT_STATS])
    v = _to_vec(start if start is not None else params_for(maxlen))
    current = _evaluate(v, maxlen, num, seed)
    step_fd = 0.05
    for _ in range(iterations):
        if np.max(np.abs(current - goal)) < tol:
            break
        jac = np.empty((len(FIT_STATS), len(FIT_FIELDS)))
        for j in range(len(FIT_FIELDS)):
            probe = v.copy()
            probe[j] += step_fd
            jac[:, j] = (_evaluate(probe, maxlen, num, seed) - current) / step_fd
        delta = np.linalg.lstsq(jac, goal - current, rcond=None)[0]
        delta = np.clip(delta, -0.5, 0.5)
        for damping in (1.0, 0.5, 0.25, 0.125):  # accept the first step that reduces the error
            trial = v + damping * delta
            trial_stats = _evaluate(trial, maxlen, num, seed)
            if np.sum((trial_stats - goal) ** 2) < np.sum((current - goal) ** 2):
                v, current = trial, trial_stats
                break
        else:
            break
    errors = {s: float(np.exp(c - g) - 1.0) for s, c, g in zip(FIT_STATS, current, goal, strict=True)}
    return _from_vec(v), errors


if __name__ == "__main__":  # python -m dualpath.workload.calibrate
    for bucket in sorted(TABLE2):
        fitted, errs = fit_params(bucket, num=4000)
        print(bucket, fitted, {k: round(e, 4) for k, e in errs.items()})

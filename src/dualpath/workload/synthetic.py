"""Synthetic agent trajectories whose Table 2 statistics match the paper's (spec section 1).

Model of one trajectory (docs/workload.md explains the choice):

1. A target final length ``F = maxlen * u**(1/final_shape)`` (a Kumaraswamy(final_shape, 1) fraction
   of MaxLen: most rollouts run close to the limit, some end early).
2. A first turn that appends the task prompt, ``A0 ~ LogNormal(median=first_append, sigma=0.5)``.
3. A per-trajectory "verbosity" ``X ~ LogNormal(mean 1, sigma=traj_sigma)``: the trajectory's append
   scale is ``append_mean * X`` and its generation scale ``gen_mean * X**GEN_COUPLING``. Verbose
   trajectories reach ``F`` in few turns, which gives the negative correlation between turn count
   and append size that makes the table's columns consistent.
4. Later turns draw append and generation lengths around those scales (mean-1 lognormal noise per
   turn) until the next turn would exceed ``F``.

Trajectory-level draws (u, A0, X) are stratified (Latin hypercube over the 500-trajectory set), so a
small set already has the bucket's statistics; per-turn noise averages out within a trajectory.
Deterministic: everything comes from ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from dualpath.core.errors import ConfigError, require
from dualpath.core.units import parse_tokens
from dualpath.workload.types import Trajectory, Turn

FIRST_APPEND_SIGMA = 0.3  # spread of the task prompt (first turn) around its median
APPEND_TURN_SIGMA = 0.8  # per-turn spread of appends (tool outputs vary a lot)
GEN_TURN_SIGMA = 0.6  # per-turn spread of generations
_CHUNK = 128  # turns drawn at a time
GEN_COUPLING = 0.5  # generation scale ~ X**0.5: verbose trajectories also generate more


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticParams:
    """Parameters of the trajectory model (see the module docstring)."""

    final_shape: float  # Kumaraswamy a of F/maxlen; mean fraction = a / (a + 1)
    first_append: float  # median tokens of the first (task prompt) append
    append_mean: float  # mean tokens per later append, before the trajectory factor
    gen_mean: float  # mean tokens per generation, before the trajectory factor
    traj_sigma: float  # lognormal sigma of the per-trajectory factor X

    def __post_init__(self) -> None:
        for key in ("final_shape", "first_append", "append_mean", "gen_mean"):
            require(getattr(self, key) > 0, key, getattr(self, key), "must be > 0")
        require(0 <= self.traj_sigma <= 3, "traj_sigma", self.traj_sigma, "must be in [0, 3]")


# Fitted by `python -m dualpath.workload.calibrate` (fit_params, num=4000, seed=0) against TABLE2;
# residuals at num=500 over seeds 0..19: at most 2.6% (append/turn), see docs/workload.md.
BUCKET_PARAMS: dict[int, SyntheticParams] = {
    32768: SyntheticParams(
        final_shape=7.954, first_append=5645.0, append_mean=464.9, gen_mean=159.7, traj_sigma=0.7875
    ),
    49152: SyntheticParams(
        final_shape=6.992, first_append=7473.0, append_mean=358.0, gen_mean=188.0, traj_sigma=0.8464
    ),
    65536: SyntheticParams(
        final_shape=6.090, first_append=9230.0, append_mean=325.2, gen_mean=195.6, traj_sigma=0.9172
    ),
}


def resolve_maxlen(maxlen: int | str) -> int:
    """``"64k"``, ``"64K"``, ``65536`` -> 65536. Any positive token count >= 4096 is accepted."""
    value = parse_tokens(maxlen) if isinstance(maxlen, str) else maxlen
    require(
        isinstance(value, int) and value >= 4096,
        "maxlen",
        maxlen,
        "must be a token count >= 4096 (calibrated buckets: 32k, 48k, 64k)",
    )
    return int(value)


def params_for(maxlen: int) -> SyntheticParams:
    """Calibrated parameters for a Table 2 bucket; other MaxLens interpolate linearly between the
    buckets (clamped outside 32K..64K). Only the three buckets are calibrated."""
    if maxlen in BUCKET_PARAMS:
        return BUCKET_PARAMS[maxlen]
    keys = sorted(BUCKET_PARAMS)
    x = float(np.clip(maxlen, keys[0], keys[-1]))
    fields = ("final_shape", "first_append", "append_mean", "gen_mean", "traj_sigma")
    values = {f: float(np.interp(x, keys, [getattr(BUCKET_PARAMS[k], f) for k in keys])) for f in fields}
    return SyntheticParams(**values)


def _stratified_uniform(rng: np.random.Generator, num: int) -> np.ndarray:
    """One uniform per stratum ``[i/num, (i+1)/num)``, in random order (Latin hypercube column)."""
    return (rng.permutation(num) + rng.random(num)) / num


def _normal_quantiles(u: np.ndarray) -> np.ndarray:
    dist = NormalDist()
    return np.array([dist.inv_cdf(min(max(p, 1e-12), 1 - 1e-12)) for p in u], dtype=np.float64)


def _mean_one_lognormal(rng: np.random.Generator, sigma: float, size: int) -> np.ndarray:
    return np.exp(sigma * rng.standard_normal(size) - 0.5 * sigma * sigma)


def _one_trajectory(
    rng: np.random.Generator,
    traj_id: str,
    final_len: int,
    first_append: int,
    append_scale: float,
    gen_scale: float,
) -> Trajectory:
    first_gen = max(1, int(round(gen_scale * _mean_one_lognormal(rng, GEN_TURN_SIGMA, 1)[0])))
    first_append = max(1, min(first_append, final_len - first_gen))
    budget = final_len - first_append - first_gen
    appends: np.ndarray = np.empty(0, dtype=np.int64)
    gens: np.ndarray = np.empty(0, dtype=np.int64)
    while True:  # fixed-size chunks: turn j's lengths do not depend on the budget
        a = np.maximum(1, np.rint(append_scale * _mean_one_lognormal(rng, APPEND_TURN_SIGMA, _CHUNK))).astype(
            np.int64
        )
        g = np.maximum(1, np.rint(gen_scale * _mean_one_lognormal(rng, GEN_TURN_SIGMA, _CHUNK))).astype(
            np.int64
        )
        appends, gens = np.concatenate([appends, a]), np.concatenate([gens, g])
        cum = np.cumsum(appends + gens)
        if cum[-1] > budget:
            break
    num_more = int(np.searchsorted(cum, budget, side="right"))
    turns = [Turn(append_len=first_append, gen_len=first_gen)]
    turns.extend(Turn(append_len=int(appends[i]), gen_len=int(gens[i])) for i in range(num_more))
    return Trajectory(traj_id, tuple(turns))


def generate_trajectories(
    maxlen: int | str, num: int, seed: int = 0, params: SyntheticParams | None = None
) -> list[Trajectory]:
    """``num`` synthetic trajectories for MaxLen ``maxlen`` (``32768``/``"32k"``, 48K, 64K are
    calibrated to Table 2). Same arguments -> identical trajectories. ``params`` overrides the
    bucket's parameters (used by the calibration). Ids are ``syn<maxlen//1024>k-<seed>-<i>``."""
    max_len = resolve_maxlen(maxlen)
    require(isinstance(num, int) and num >= 1, "num", num, "must be an int >= 1")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError("seed", seed, "must be an int >= 0")
    p = params if params is not None else params_for(max_len)
    rng = np.random.default_rng(seed)
    final_frac = _stratified_uniform(rng, num) ** (1.0 / p.final_shape)
    z_first = _normal_quantiles(_stratified_uniform(rng, num))
    z_traj = _normal_quantiles(_stratified_uniform(rng, num))
    x = np.exp(p.traj_sigma * z_traj - 0.5 * p.traj_sigma**2)
    out = []
    for i in range(num):
        final_len = max(2, int(final_frac[i] * max_len))
        first_append = int(round(p.first_append * np.exp(FIRST_APPEND_SIGMA * z_first[i])))
        traj_rng = np.random.default_rng([seed, i])  # per-trajectory stream
        out.append(
            _one_trajectory(
                traj_rng,
                f"syn{max_len // 1024}k-{seed}-{i}",
                final_len,
                first_append,
                p.append_mean * x[i],
                p.gen_mean * x[i] ** GEN_COUPLING,
            )
        )
    return out

"""Step times read from a measured engine profile (``spec.engine_profile.EngineProfile``).

:class:`ProfileTimes` interpolates a profile's grids: bilinear between grid points, linear from
the last two points of an axis beyond it, the measured value at a grid point. A prefill batch of
several requests costs the zero-cache step of its total new tokens (the linear layers run on the
concatenated tokens) plus, per request, what its cached prefix adds at its own length (attention
is one call per request) and, per request beyond the first, the profile's measured
``prefill_request_s``: ``t(0, sum n) + sum_i (t(c_i, n_i) - t(0, n_i)) + (k - 1) r``; the
profile's measured multi-request ``batches`` check that rule (nothing is fitted to them).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from dualpath.spec.engine_profile import EngineProfile


class ProfileTimes:
    """Step times read from an :class:`EngineProfile`'s grids (module docstring)."""

    def __init__(self, profile: EngineProfile) -> None:
        self.profile = profile
        self._pc, self._pn, self._pv = _axes([(p.cached_len, p.new_len, p.seconds) for p in profile.prefill])
        self._db, self._dc, self._dv = _axes([(p.batch, p.context_len, p.seconds) for p in profile.decode])
        joins = sorted((p.prompt_len, p.seconds) for p in profile.join)
        self._jx = [float(x) for x, _s in joins]
        self._jy = [s for _x, s in joins]

    def prefill_s(self, entries: Sequence[tuple[int, int]]) -> float:
        """Seconds of one prefill step over ``(cached_len, new_len)`` entries."""
        total = sum(n for _c, n in entries)
        if total <= 0:
            return 0.0
        extra = (len(entries) - 1) * self.profile.prefill_request_s
        return self.prefill_zero_s(total) + sum(self.prefill_cached_s(c, n) for c, n in entries) + extra

    def prefill_zero_s(self, new_len: int) -> float:
        """A step of ``new_len`` new tokens on no cache."""
        return self._prefill(0.0, float(new_len)) if new_len > 0 else 0.0

    def prefill_cached_s(self, cached_len: int, new_len: int) -> float:
        """What a ``cached_len`` prefix adds to a request of ``new_len`` new tokens (may be a
        little below 0 where the measured cached step was faster than the zero-cache one)."""
        if new_len <= 0 or cached_len <= 0:
            return 0.0
        return self._prefill(float(cached_len), float(new_len)) - self._prefill(0.0, float(new_len))

    def decode_step_s(self, batch: int, context_len: float) -> float:
        """Seconds of one decode step of ``batch`` requests of mean context ``context_len``."""
        if batch <= 0:
            return 0.0
        return max(0.0, _bilinear(self._db, self._dc, self._dv, float(batch), float(context_len)))

    def join_s(self, prompt_len: int) -> float:
        """Seconds a decode engine spends admitting a prefilled prompt (0 without join points)."""
        if not self._jx or prompt_len <= 0:
            return 0.0
        i0, i1, w = _bracket(self._jx, float(prompt_len))
        return max(0.0, self._jy[i0] + (self._jy[i1] - self._jy[i0]) * w)

    def _prefill(self, cached_len: float, new_len: float) -> float:
        return max(0.0, _bilinear(self._pc, self._pn, self._pv, cached_len, new_len))


def _axes(points: list[tuple[int, int, float]]) -> tuple[list[float], list[float], list[list[float]]]:
    xs = sorted({float(x) for x, _y, _s in points})
    ys = sorted({float(y) for _x, y, _s in points})
    rows = [[0.0] * len(ys) for _ in xs]
    for x, y, s in points:
        rows[xs.index(float(x))][ys.index(float(y))] = s
    return xs, ys, rows


def _bracket(axis: list[float], v: float) -> tuple[int, int, float]:
    """Indices of the two axis points to interpolate ``v`` between (the last two beyond the axis,
    extrapolating) and ``v``'s weight on the second."""
    if len(axis) == 1:
        return 0, 0, 0.0
    i = min(max(bisect.bisect_right(axis, v) - 1, 0), len(axis) - 2)
    return i, i + 1, (v - axis[i]) / (axis[i + 1] - axis[i])


def _bilinear(xs: list[float], ys: list[float], rows: list[list[float]], x: float, y: float) -> float:
    i0, i1, wx = _bracket(xs, x)
    j0, j1, wy = _bracket(ys, y)
    lo = rows[i0][j0] + (rows[i0][j1] - rows[i0][j0]) * wy
    hi = rows[i1][j0] + (rows[i1][j1] - rows[i1][j0]) * wy
    return lo + (hi - lo) * wx

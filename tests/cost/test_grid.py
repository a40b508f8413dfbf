"""Grid interpolation: exact at measured points, monotone between, floors below, growth above."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.core.errors import ConfigError
from dualpath.cost.grid import Grid

XS = (1.0, 4.0, 16.0, 64.0)
YS = (2.0, 8.0, 64.0)


def _latency(x: float, y: float) -> float:  # increasing in both axes, not log-linear
    return 1e-5 + 3e-6 * x + 2e-7 * x * y * y


def _grid() -> Grid:
    points = [((x, y), _latency(x, y)) for x, y in itertools.product(XS, YS)]
    return Grid.from_points(("batch", "isl"), (1, 2), points)


def test_exact_at_every_grid_point() -> None:
    grid = _grid()
    for x, y in itertools.product(XS, YS):
        value, extrapolated = grid.evaluate(x, y)
        assert value == _latency(x, y)
        assert extrapolated == ()


@given(a=st.floats(1.0, 64.0), b=st.floats(1.0, 64.0), y=st.floats(2.0, 64.0))
@settings(max_examples=200, deadline=None)
def test_monotone_between_points(a: float, b: float, y: float) -> None:
    grid = _grid()
    lo, hi = sorted((a, b))
    assert grid(lo, y) <= grid(hi, y) * (1 + 1e-12)
    assert grid(y, lo) <= grid(y, hi) * (1 + 1e-12) or not 2.0 <= lo


def test_between_two_points_lies_between_them() -> None:
    grid = _grid()
    mid = grid(8.0, 8.0)
    assert _latency(4.0, 8.0) < mid < _latency(16.0, 8.0)
    # log-log: halfway in log x is the geometric mean of the neighbours
    assert mid == pytest.approx(math.sqrt(_latency(4.0, 8.0) * _latency(16.0, 8.0)))


def test_floor_below_and_growth_above() -> None:
    grid = _grid()
    assert grid(0.5, 8.0) == _latency(1.0, 8.0)  # a launch floor: no cheaper than the smallest
    value, extrapolated = grid.evaluate(16.0, 128.0)
    assert value == pytest.approx(_latency(16.0, 64.0) * 4.0)  # growth 2 in isl: (128/64)^2
    assert extrapolated == ("isl",)
    assert grid(128.0, 64.0) == pytest.approx(_latency(64.0, 64.0) * 2.0)


def test_ragged_grid_uses_each_branch() -> None:
    # the second axis is measured at different values under each first-axis value
    grid = Grid.from_points(
        ("heads", "batch"), (1, 1), [((8, 1), 1.0), ((8, 4), 4.0), ((16, 2), 4.0), ((16, 8), 16.0)]
    )
    assert grid(8, 4) == 4.0 and grid(16, 2) == 4.0
    assert grid(8, 2) == pytest.approx(2.0)
    assert 2.0 < grid(12, 2) < 4.0


def test_bad_input_names_the_value() -> None:
    with pytest.raises(ConfigError, match="points"):
        Grid.from_points(("m",), (1,), [((1.0,), 0.0)])
    with pytest.raises(ConfigError, match="growth"):
        Grid.from_points(("m", "n"), (1,), [((1.0, 1.0), 1.0)])
    with pytest.raises(ConfigError, match="query"):
        _grid()(1.0)

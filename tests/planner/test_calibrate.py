"""The budget_scale loss (planner/calibrate.py): zero on the paper's Fig. 5 curve, growing off it."""

from __future__ import annotations

import math

import pytest

from dualpath.planner.calibrate import best_point, fig5_loss

PAPER = {"1": 0.48, "10": 2.10, "50": 1.8, "100": 1.65, "200": 1.5, "500": 1.6, "1000": 1.27}


def test_loss_is_zero_on_the_published_curve_and_grows_off_it() -> None:
    assert fig5_loss(PAPER) == 0.0
    assert fig5_loss({**PAPER, "10": 4.2}) == pytest.approx(math.log(2) ** 2)
    assert fig5_loss({**PAPER, "100": 1.2}) == pytest.approx(math.log(1.2 / 1.5) ** 2)
    assert fig5_loss({**PAPER, "100": 1.79}) == 0.0  # inside the plateau band
    assert fig5_loss({**PAPER, "1": None}) == pytest.approx(math.log(10) ** 2)  # infeasible
    assert fig5_loss({"100": 1.6}) == 0.0  # ratios not swept are not counted


def test_best_point_prefers_lower_loss_then_smaller_scale() -> None:
    pts = [
        {"budget_scale": 4.0, "loss": 1.0},
        {"budget_scale": 2.0, "loss": 1.0},
        {"budget_scale": 8.0, "loss": 3.0},
    ]
    assert best_point(pts)["budget_scale"] == 2.0


def test_best_point_skips_inadmissible_scales_and_the_limit_is_the_smallest() -> None:
    from dualpath.planner.calibrate import admissible_limit, best_point

    points = [
        {"budget_scale": 4.0, "loss": 3.0, "admissible": True},
        {"budget_scale": 64.0, "loss": 1.0, "admissible": False},
        {"budget_scale": 8.0, "loss": 2.0, "admissible": True},
    ]
    assert best_point(points)["budget_scale"] == 8.0
    limits = {"a": {"limit_scale": 90.0}, "b": {"limit_scale": 40.0}, "c": {"limit_scale": None}}
    assert admissible_limit(limits) == 40.0
    assert admissible_limit({"c": {"limit_scale": None}}) == float("inf")

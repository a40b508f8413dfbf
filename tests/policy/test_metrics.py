from __future__ import annotations

import pytest

from dualpath.core.errors import DualpathError
from dualpath.policy import (
    attention_time_balance,
    bubble_fraction,
    max_over_avg,
    snic_traffic_balance,
)


def test_max_over_avg() -> None:
    assert max_over_avg([1, 1, 1, 1]) == 1.0
    assert max_over_avg([3, 1, 1, 1]) == pytest.approx(2.0)
    assert max_over_avg([0, 0]) == 1.0
    with pytest.raises(DualpathError):
        max_over_avg([])
    with pytest.raises(DualpathError):
        max_over_avg([1, -1])


def test_snic_balance_accepts_mapping_and_counts_idle_snics() -> None:
    assert snic_traffic_balance({"pe0": 2e9, "de0": 0.0}) == pytest.approx(2.0)
    assert snic_traffic_balance([1.0, 1.0, 1.0]) == 1.0


def test_attention_balance_skips_idle_steps() -> None:
    steps = [[1.0, 1.0], [0.0, 0.0], [2.0, 1.0]]
    assert attention_time_balance(steps) == pytest.approx((1.0 + 4 / 3) / 2)
    assert attention_time_balance([]) == 1.0
    assert bubble_fraction([[1.0, 1.0]]) == 0.0
    assert bubble_fraction([[2.0, 1.0]]) == pytest.approx(0.25)

"""P/D range, equations 1-9."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dualpath.analysis.pd_range import pd_range
from dualpath.core.errors import ConfigError


def test_paper_node_exact() -> None:
    r = pd_range(8, 1, 50, 500)
    assert r.min_p_over_d == Fraction(1, 7)
    assert r.max_p_over_d == Fraction(7, 2)
    assert r.binding == "de_cnic_write+de_dram"
    assert r.upper_bounds["de_cnic_read"] == 6
    assert r.feasible and r.contains(2, 4) and r.contains(1, 7) and not r.contains(1, 8)


@pytest.mark.parametrize("g,s", [(8, 1), (8, 2), (16, 1), (16, 3), (4, 1)])
def test_general_formulas(g: int, s: int) -> None:
    b, m = Fraction(50), Fraction(2000)  # DRAM generous: the NIC constraints decide
    r = pd_range(g, s, b, m)
    assert r.min_p_over_d == Fraction(s, g - s)
    assert r.max_p_over_d == min(Fraction(g - 2 * s, s), Fraction(g - s, 2 * s))
    assert r.upper_bounds["de_dram"] == (m / (b * s) - 3) / 2


def test_dram_binds_when_slow() -> None:
    r = pd_range(8, 1, 50, 300)
    assert r.binding == "de_dram" and r.max_p_over_d == Fraction(3, 2)


def test_infeasible_when_storage_too_fast() -> None:
    r = pd_range(8, 5, 50, 500)  # 2S/g > B
    assert not r.pe_cnic_read_ok and not r.feasible
    r = pd_range(8, 1, 50, 100)  # DRAM below 3 x S: no positive P/D
    assert not r.feasible and r.max_p_over_d < 0


def test_slower_snic() -> None:
    # 200 Gbps SNIC with 400 Gbps CNICs: S = 25 GB/s, gB/S = 16
    r = pd_range(8, 1, 50, 500, storage_per_node=25)
    assert r.min_p_over_d == Fraction(1, 15)
    assert r.max_p_over_d == Fraction(15, 2)


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError, match="g=0"):
        pd_range(0, 1, 50, 500)
    with pytest.raises(ConfigError, match="M=-1"):
        pd_range(8, 1, 50, -1)

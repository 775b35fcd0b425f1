"""One value per seed: the median of the known values, the spread and the table cell, by hand."""

from __future__ import annotations

import pytest

from llds.analysis.seeds import median_over_seeds, seed_spread, spread_md


def test_median_over_seeds_ignores_unknown_values() -> None:
    assert median_over_seeds([0.3, None, 0.1, 0.2]) == pytest.approx(0.2)
    assert median_over_seeds([None]) is None


def test_seed_spread_gives_median_mean_and_standard_error_by_hand() -> None:
    got = seed_spread([0.0, 0.585, 0.355])
    # mean 0.94/3; squared deviations 0.098178 + 0.073803 + 0.001736 = 0.173717;
    # s.d.^2 = 0.173717 / 2; se = sqrt(0.0868583 / 3)
    assert got["median"] == pytest.approx(0.355)
    assert got["mean"] == pytest.approx(0.313333, abs=1e-6)
    assert got["se"] == pytest.approx(0.170155, abs=1e-6)
    assert seed_spread([0.4])["se"] is None
    assert seed_spread([])["median"] is None


def test_spread_md_prints_every_seed_then_the_summary() -> None:
    values = [0.0, 0.585, None, 0.355]
    assert spread_md(values, seed_spread(values)) == (
        "0.000 / 0.585 / - / 0.355; median 0.355, mean 0.313 ± 0.170"
    )
    assert spread_md([0.4], seed_spread([0.4])) == "0.400; median 0.400, mean 0.400"
    assert spread_md([None], seed_spread([None])) == "-"
    assert spread_md([], seed_spread([])) == "-"

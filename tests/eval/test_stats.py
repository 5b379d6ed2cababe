"""Student-t confidence intervals: table values, the large-df expansion, hand-computed CIs."""

from __future__ import annotations

import math

import pytest

from eval.stats import Estimate, mean_ci, t975


@pytest.mark.parametrize(
    ("df", "expected"),
    [
        (1, 12.706),
        (2, 4.303),
        (4, 2.776),
        (10, 2.228),
        (30, 2.042),
        (40, 2.021),
        (60, 2.000),
        (120, 1.980),
        (10**6, 1.960),
    ],
)
def test_t975_matches_published_quantiles(df: int, expected: float) -> None:
    assert t975(df) == pytest.approx(expected, abs=1.5e-3)


def test_t975_rejects_zero_df() -> None:
    with pytest.raises(ValueError, match="degrees of freedom"):
        t975(0)


def test_mean_ci_by_hand() -> None:
    # mean 2, sample stddev 1, n = 3 -> half-width 4.303 / sqrt(3)
    e = mean_ci([1.0, 2.0, 3.0])
    assert e.mean == pytest.approx(2.0)
    assert e.half_width == pytest.approx(4.303 / math.sqrt(3))
    assert e.n == 3


def test_mean_ci_drops_non_finite_and_handles_few_values() -> None:
    e = mean_ci([1.0, math.nan, math.inf, 3.0])
    assert (e.mean, e.n) == (2.0, 2)
    one = mean_ci([5.0])
    assert one.mean == 5.0 and math.isnan(one.half_width)
    assert mean_ci([]).n == 0 and mean_ci([math.nan]).fmt() == "-"


def test_format() -> None:
    assert Estimate(0.25, 0.05, 3).fmt(".1f", percent=True) == "25.0 ± 5.0%"
    assert Estimate(1.0, math.nan, 1).fmt(".2f") == "1.00"

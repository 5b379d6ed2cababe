"""Student-t confidence intervals: table values, the large-df expansion, hand-computed CIs."""

from __future__ import annotations

import math

import pytest

from eval.stats import Estimate, mean_ci, paired, t975


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


def test_paired_difference_ci_and_win_rate_by_hand() -> None:
    """Differences 1.9, 2, 2.1 (A higher, higher is better): mean 2, half-width
    4.303 x 0.1 / sqrt(3), three wins; pairs with a missing side are left out."""
    a = [11.9, 12.0, 12.1, math.nan, 5.0]
    b = [10.0, 10.0, 10.0, 1.0, None]
    p = paired(a, b, higher_is_better=True)
    assert p.n == 3
    assert p.diff.mean == pytest.approx(2.0)
    assert p.diff.half_width == pytest.approx(0.4303 / math.sqrt(3))
    assert (p.wins, p.losses, p.ties, p.win_rate) == (3, 0, 0, 1.0)
    assert p.significant and p.better is True
    d = p.as_dict()
    hw = 0.4303 / math.sqrt(3)
    assert d["ci95"] == pytest.approx([2.0 - hw, 2.0 + hw])


def test_paired_direction_ties_and_undecided_differences() -> None:
    # lower is better (violations): A lower in two pairs, equal in one, higher in one
    p = paired([0.0, 0.1, 0.2, 0.5], [0.0, 0.3, 0.4, 0.2], higher_is_better=False)
    assert (p.wins, p.losses, p.ties) == (2, 1, 1)
    assert p.win_rate == pytest.approx((2 + 0.5) / 4)
    assert not p.significant and p.better is None  # differences 0, -.2, -.2, +.3
    with pytest.raises(ValueError, match="equal lengths"):
        paired([1.0], [1.0, 2.0], higher_is_better=True)


def test_pairing_cancels_the_spread_between_scenarios() -> None:
    """Scenarios differ by 10x more than A and B do: unpaired CIs overlap, the paired
    difference is significant."""
    base = [1.0, 5.0, 9.0, 3.0, 7.0, 2.0]
    a = [x + 0.5 for x in base]
    b = [x + 0.1 * (i % 2) for i, x in enumerate(base)]
    ea, eb = mean_ci(a), mean_ci(b)
    assert abs(ea.mean - eb.mean) < ea.half_width + eb.half_width
    assert paired(a, b, higher_is_better=True).better is True

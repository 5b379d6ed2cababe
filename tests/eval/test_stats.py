"""Student-t confidence intervals: table values, the large-df expansion, hand-computed CIs."""

from __future__ import annotations

import math
import statistics

import pytest

from eval.stats import Estimate, holm, mean_ci, mean_ci_over, paired, t975, t_two_sided


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
    # an interval past the values the metric can take is shown cut there, not as ± width
    rate = (0.0, 1.0)
    assert Estimate(0.1, 0.25, 3).fmt(".1f", percent=True, bounds=rate) == "10.0 [0.0, 35.0]%"
    assert Estimate(0.9, 0.05, 3).fmt(".1f", percent=True, bounds=rate) == "90.0 ± 5.0%"


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


def test_the_interval_is_over_scenarios_not_their_seeds() -> None:
    """Three scenarios x three seeds whose differences barely move with the seed: as nine
    independent samples they looked decisive; three scenarios (+0.5, -0.1, +0.4) are not."""
    per_scenario = {"a": 0.5, "b": -0.1, "c": 0.4}
    keys = [(scn, seed) for scn in per_scenario for seed in range(3)]
    a = [per_scenario[scn] + 1e-3 * seed for scn, seed in keys]
    b = [0.0] * len(keys)
    as_pairs = paired(a, b, higher_is_better=True)
    assert as_pairs.unit == "pairs" and as_pairs.n == 9 and as_pairs.significant
    p = paired(a, b, higher_is_better=True, groups=[scn for scn, _ in keys])
    assert (p.unit, p.n, p.pairs) == ("scenarios", 3, 9)
    means = [d + 1e-3 for d in per_scenario.values()]  # each scenario's seeds averaged
    assert p.diff.mean == pytest.approx(statistics.fmean(means))
    hw = 4.303 * statistics.stdev(means) / math.sqrt(3)
    assert p.diff.half_width == pytest.approx(hw, rel=1e-3)
    assert not p.significant and p.better is None
    assert (p.wins, p.losses, p.win_rate) == (6, 3, pytest.approx(6 / 9))
    assert p.as_dict()["unit"] == "scenarios" and p.as_dict()["pairs"] == 9
    # one scenario: the interval over its seeds (it covers their noise only)
    one = paired(a[:3], b[:3], higher_is_better=True, groups=["a"] * 3)
    assert (one.unit, one.n) == ("pairs", 3)
    with pytest.raises(ValueError, match="2 groups"):
        paired([1.0], [2.0], higher_is_better=True, groups=["a", "b"])


@pytest.mark.parametrize(("n", "significant"), [(2, False), (5, False), (6, True), (9, True)])
def test_identical_differences_need_the_sign_test(n: int, significant: bool) -> None:
    # a CI of width 0 excluded 0 from two pairs on: "-100 ± 0 pp *" over 3 seeds
    p = paired([0.0] * n, [1.0] * n, higher_is_better=False)
    assert p.diff.half_width == 0.0
    assert p.significant is significant and p.better is (True if significant else None)


@pytest.mark.parametrize(("n", "significant"), [(3, False), (6, True)])
def test_differences_equal_but_for_rounding_need_the_sign_test_too(n: int, significant: bool):
    """0.3 - 0.2, 0.7 - 0.6 and 1.1 - 1.0 differ in their last bits: a t interval 1.6e-16
    wide called three of them significant (p = 1e-31), where the sign test says p = 0.25."""
    a = [0.3, 0.7, 1.1, 0.5, 0.9, 1.3][:n]
    p = paired(a, [x - 0.1 for x in a], higher_is_better=True, groups=list(range(n)))
    assert p.diff.half_width == 0.0 and p.diff.mean == pytest.approx(0.1)
    assert p.significant is significant
    assert p.p_value == pytest.approx(2 * 0.5**n)


def test_rounding_differences_are_ties_in_the_mean_too() -> None:
    p = paired([0.1 + 0.2] * 3, [0.3] * 3, higher_is_better=True)
    assert (p.ties, p.diff.mean, p.significant) == (3, 0.0, False)


def test_a_difference_beyond_a_float_is_left_out_of_the_counts_as_of_the_mean() -> None:
    p = paired([1e308, -1e308, 1.0], [-1e308, 1e308, 0.5], higher_is_better=True)
    assert (p.n, p.pairs, p.wins, p.losses) == (1, 1, 1, 0)


INF = math.inf


@pytest.mark.parametrize(
    ("a", "b", "counts", "significant"),
    [
        # A (lower is better) is better on the finite pairs, but overloaded a service where
        # B did not: a loss past any bound, and the finite pairs' claim is refused
        ([1.0, 1.0, 1.0, INF], [2.0, 2.1, 1.9, 1.0], (3, 1, 0, 0, 1), False),
        # B overloaded where A did not: a win past any bound, the claim stands
        ([1.0, 1.0, 1.0, 1.0], [2.0, 2.1, 1.9, INF], (4, 0, 0, 1, 0), True),
        # both overloaded: a tie, and no difference to average
        ([1.0, 1.0, 1.0, INF], [2.0, 2.1, 1.9, INF], (3, 0, 1, 0, 0), True),
    ],
    ids=["A overloaded", "B overloaded", "both"],
)
def test_a_pair_with_an_infinite_value_is_won_or_lost_not_dropped(
    a: list[float], b: list[float], counts: tuple[int, ...], significant: bool
) -> None:
    p = paired(a, b, higher_is_better=False)
    assert (p.wins, p.losses, p.ties, p.better_unbounded, p.worse_unbounded) == counts
    assert p.n == 3 and p.diff.mean == pytest.approx(-1.0)  # the finite pairs' mean
    assert p.significant is significant and (p.better is True) is significant
    assert math.isnan(p.p_value) is not significant  # refused: no test for Holm to count
    assert p.as_dict()["claim_refused"] is not significant


@pytest.mark.parametrize(
    ("t", "df", "p"),
    [
        (1.0, 1, 0.5),  # Cauchy: P(|T| >= 1) = 1/2
        (2.0, 2, 1 - 2 / math.sqrt(6)),  # closed form for two degrees of freedom
        (0.0, 7, 1.0),
        (math.inf, 3, 0.0),
    ],
)
def test_t_two_sided_against_closed_forms(t: float, df: int, p: float) -> None:
    assert t_two_sided(t, df) == pytest.approx(p, abs=1e-12)


@pytest.mark.parametrize("df", [1, 2, 3, 5, 9, 10, 29, 30, 31, 60, 200])
def test_the_t_test_agrees_with_the_interval(df: int) -> None:
    """p = 0.05 exactly where the 95% CI's end touches 0, at the quantile table's 3
    decimals (and the series beyond it)."""
    assert t_two_sided(t975(df), df) == pytest.approx(0.05, abs=1e-4)


def test_mean_ci_over_groups_averages_each_group_first() -> None:
    # groups a: 1, 3 (mean 2; a NaN dropped), b: 6: the interval over the means 2 and 6
    est = mean_ci_over([1.0, 3.0, math.nan, 6.0], ["a", "a", "a", "b"])
    assert (est.n, est.mean) == (2, 4.0)
    assert est.half_width == pytest.approx(12.706 * 2.0)  # t(1) x stdev(2, 6) / sqrt(2)
    assert mean_ci_over([1.0, 3.0], ["a", "a"]) == mean_ci([1.0, 3.0])  # one group
    with pytest.raises(ValueError, match="3 values and 2 groups"):
        mean_ci_over([1.0, 2.0, 3.0], ["a", "b"])


def test_holm_adjusts_step_down_and_keeps_order() -> None:
    assert holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert holm([0.5, 0.6]) == [1.0, 1.0]
    assert holm([]) == []
    # no test made: NaN passed through and not counted (it made everything after it 1.0)
    got = holm([0.001, math.nan, 0.002, 0.003])
    assert math.isnan(got[1])
    assert [got[0], got[2], got[3]] == pytest.approx([0.003, 0.004, 0.004])


@pytest.mark.parametrize(
    ("diffs", "significant"),
    [([1.0, 1.2, 0.9, 1.1, 1.05], True), ([1.0, -1.0, 0.5, -0.4], False), ([0.3] * 6, True)],
)
def test_the_p_value_matches_the_verdict(diffs: list[float], significant: bool) -> None:
    p = paired(diffs, [0.0] * len(diffs), higher_is_better=True)
    assert p.significant is significant
    assert (p.p_value < 0.05) is significant

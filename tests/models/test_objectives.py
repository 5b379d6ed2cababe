"""Shared objective functions: CoPart's unfairness, slowdowns, SLO violation, SLO-first."""

from __future__ import annotations

import math

import pytest

from models.objectives import (
    INFEASIBLE,
    OBJECTIVES,
    Outcome,
    SloConstrained,
    fair_throughput_objective,
    get_objective,
    slo_excess,
    slo_first_objective,
    slo_violation,
    slowdown,
    unfairness,
    window_noise,
    window_requests,
)


@pytest.mark.parametrize(
    ("slowdowns", "expected"),
    [
        ((1.0, 1.0, 1.0), 0.0),
        ((1.0, 3.0), 0.5),  # mean 2, population stddev 1
        ((2.0,), 0.0),
        ((1.0, math.inf), math.inf),
    ],
)
def test_unfairness_is_sigma_over_mu(slowdowns, expected):
    assert unfairness(slowdowns) == pytest.approx(expected)


def test_slowdown():
    assert slowdown(2e9, 1e9) == 2.0
    assert slowdown(2e9, 0.0) == math.inf
    with pytest.raises(ValueError, match="positive"):
        slowdown(0.0, 1.0)


def test_slo_violation():
    assert slo_violation(0.9, 1.0) == 0.0
    assert slo_violation(1.5, 1.0) == pytest.approx(0.5)
    assert slo_violation(math.nan, 1.0) == math.inf  # no answers is not a met SLO
    with pytest.raises(ValueError, match="positive"):
        slo_violation(1.0, 0.0)


def test_slo_first_is_lexicographic():
    met_unfair = Outcome((1.0, 3.0), (0.9,), (1.0,))
    missed_fair = Outcome((1.0, 1.0), (1.01,), (1.0,))
    met_fair_slow = Outcome((3.0, 3.0), (0.9,), (1.0,))
    assert slo_first_objective(met_unfair) < slo_first_objective(missed_fair)
    assert slo_first_objective(met_fair_slow) < slo_first_objective(met_unfair)
    assert Outcome((), (math.nan,), (1.0,)).violations == 1


def test_objective_lookup():
    assert get_objective(None, has_lc=False) is OBJECTIVES["fairness"]
    assert get_objective(None, has_lc=True) is OBJECTIVES["slo_first"]
    assert get_objective("throughput", has_lc=True)(Outcome((1.0, 2.0))) == 1.5
    with pytest.raises(ValueError, match="unknown objective"):
        get_objective("speed", has_lc=False)
    with pytest.raises(ValueError, match="same length"):
        Outcome((), (1.0,), ())


def test_slo_constrained_ranks_safe_outcomes_first_then_by_the_base() -> None:
    obj = SloConstrained(fair_throughput_objective, margin=0.1)
    safe_unfair = Outcome((1.0, 3.0), (0.89,), (1.0,))
    safe_fair = Outcome((2.0, 2.0), (0.5,), (1.0,))
    within_slo_not_margin = Outcome((1.0, 1.0), (0.95,), (1.0,))
    assert obj(safe_fair) < obj(safe_unfair) < INFEASIBLE <= obj(within_slo_not_margin)
    assert SloConstrained.feasible(obj(safe_unfair))
    assert not SloConstrained.feasible(obj(within_slo_not_margin))
    # among infeasible outcomes, closer to the SLOs is better; no answer is worst
    assert obj(Outcome((), (1.0,), (1.0,))) < obj(Outcome((), (2.0,), (1.0,)))
    assert obj(Outcome((), (math.nan,), (1.0,))) == math.inf
    assert slo_excess(Outcome((), (1.0, 0.5), (1.0, 1.0)), 0.5) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="margin"):
        SloConstrained(fair_throughput_objective, 1.0)


KNOTS = {50.0: 1.0, 95.0: 2.0, 99.0: 3.0, 99.9: 5.0}


def test_window_noise_grows_with_tails_load_and_fewer_requests() -> None:
    """sqrt(p (1 - p) / n_eff) / f(x_p) / x_p: the density from the p95 - p99 spacing."""
    base = window_noise(KNOTS, 95.0, 100_000.0, 0.0, window_s=1.0)
    # n = 100,000 requests, rho 0: sqrt(.95 x .05 / 1e5) x (1 ms / 0.04) / 2 ms
    assert base == pytest.approx(math.sqrt(0.95 * 0.05 / 1e5) * 25.0 / 2.0)
    heavier = window_noise({**KNOTS, 99.0: 4.0}, 95.0, 100_000.0, 0.0)
    busier = window_noise(KNOTS, 95.0, 100_000.0, 0.5)  # n / 3
    slower = window_noise(KNOTS, 95.0, 10.0, 0.0)  # a window still holds 1,000 requests
    assert heavier == pytest.approx(2 * base) and busier == pytest.approx(math.sqrt(3) * base)
    assert slower == pytest.approx(base * math.sqrt(100.0))
    assert window_noise(KNOTS, 99.9, 1e6, 0.0) > 0  # no percentile above: p99 -> p99.9
    assert window_noise(KNOTS, 95.0, 1e5, 1.0) == math.inf
    assert window_noise({95.0: 2.0}, 95.0, 1e5, 0.0) == math.inf
    assert window_requests(95.0) == 1000

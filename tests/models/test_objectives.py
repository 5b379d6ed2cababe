"""Shared objective functions: CoPart's unfairness, slowdowns, SLO violation, SLO-first."""

from __future__ import annotations

import math

import pytest

from models.objectives import (
    OBJECTIVES,
    Outcome,
    get_objective,
    slo_first_objective,
    slo_violation,
    slowdown,
    unfairness,
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

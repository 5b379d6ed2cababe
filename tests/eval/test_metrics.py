"""Run metrics: unfairness and violation accounting on hand-built runs."""

from __future__ import annotations

import math

import pytest

from agent.types import SLO, Allocation, GroupKind, GroupSample, GroupSpec, LatencyStats, Snapshot
from eval.metrics import summarize, unfairness
from models.controller import KEEP, Decision, StepRecord


@pytest.mark.parametrize(
    ("slowdowns", "expected"), [([1.0, 1.0], 0.0), ([1.0, 3.0], 0.5), ([2.0], 0.0)]
)
def test_unfairness(slowdowns: list[float], expected: float) -> None:
    assert unfairness(slowdowns) == pytest.approx(expected)


def test_summarize_counts_violations_and_slowdowns() -> None:
    groups = {
        "lc": GroupSpec("lc", GroupKind.LC, SLO(99.0, 1.0)),
        "a": GroupSpec("a"),
        "b": GroupSpec("b"),
    }

    def rec(tail: float, decision: Decision = KEEP) -> StepRecord:
        snap = Snapshot(
            0.0,
            0.5,
            {
                "lc": GroupSample(latency=LatencyStats(100, 0.1, 0.2, tail, tail)),
                "a": GroupSample(instructions=1e9),
                "b": GroupSample(instructions=0.5e9),
            },
        )
        return StepRecord(snap, decision, Allocation({}), 1e-5)

    records = [rec(0.5), rec(2.0), rec(0.9, Decision(note="x", moves={"a": frozenset({1})}))]
    m = summarize(records, groups, {"a": 2e9, "b": 2e9})
    assert m.slo_violation_rate == pytest.approx(1 / 3)
    assert m.tail_latency_ms == pytest.approx((0.5 + 2.0 + 0.9) / 3)
    # slowdowns 1 and 2 -> stddev 0.5 / mean 1.5
    assert m.unfairness == pytest.approx(0.5 / 1.5)
    assert m.weighted_speedup == pytest.approx(1.0 + 0.5)  # IPS 2e9 and 1e9 vs 2e9
    assert m.changes_per_minute == pytest.approx(1 / (1.5 / 60))
    assert math.isclose(m.decide_us_median, 10.0)

"""Run metrics: unfairness and violation accounting on hand-built runs."""

from __future__ import annotations

import math

import pytest

from agent.types import (
    SLO,
    Allocation,
    GroupAllocation,
    GroupKind,
    GroupSample,
    GroupSpec,
    LatencyStats,
    Snapshot,
)
from eval.metrics import (
    normalized_tail,
    pooled_percentile,
    slo_windows,
    summarize,
    unfairness,
)
from models.cadence import WAIT
from models.controller import KEEP, Decision, StepRecord


@pytest.mark.parametrize(
    ("slowdowns", "expected"),
    [
        ([1.0, 1.0], 0.0),
        ([1.0, 3.0], 0.5),
        # one job starved: the least fair a run can be, sqrt(n - 1), not left out (the
        # rest read as perfectly fair) nor infinite (dropped from every comparison)
        ([1.2, math.inf], 1.0),
        ([1.2, 1.2, math.inf], math.sqrt(2)),
        ([1.2, 1.2, 1.0e12], pytest.approx(math.sqrt(2))),  # the limit it stands for
        # one job or none: nothing to judge, not a tie at 0 in a paired comparison
        ([2.0], math.nan),
        ([], math.nan),
    ],
)
def test_unfairness(slowdowns: list[float], expected: float) -> None:
    assert unfairness(slowdowns) == pytest.approx(expected, nan_ok=True)


INF = math.inf
ALONE = {"kv": 1.0, "web": 1.0}


@pytest.mark.parametrize(
    ("tails", "expected"),
    [
        ({"kv": 3.0, "web": 2.0}, 2.5),
        # kv overloaded (its queue grew without bound): the run's figure is infinite, not
        # web's 2.0 alone (kv left out, the run read better than the one above)
        ({"kv": INF, "web": 2.0}, INF),
        ({"kv": math.nan, "web": 2.0}, 2.0),  # an unknown tail: no figure to average
        ({"db": INF}, math.nan),  # no reference: no ratio, overloaded or not
    ],
)
def test_normalized_tail(tails: dict[str, float], expected: float) -> None:
    assert normalized_tail(tails, ALONE) == pytest.approx(expected, nan_ok=True)


def test_a_run_that_overloaded_a_service_is_not_the_better_tail() -> None:
    starved = normalized_tail({"kv": INF, "web": 1.5}, ALONE)
    barely_alive = normalized_tail({"kv": 40.0, "web": 1.5}, ALONE)
    assert starved > barely_alive


def test_summarize_counts_violations_and_slowdowns() -> None:
    groups = {
        "lc": GroupSpec("lc", GroupKind.LC, SLO(99.0, 1.0)),
        "a": GroupSpec("a"),
        "b": GroupSpec("b"),
    }

    def rec(tail: float, decision: Decision = KEEP) -> StepRecord:
        snap = Snapshot(
            0.0,
            1.0,
            {
                # 1 s and enough requests per interval: each is an SLO window of its own
                "lc": GroupSample(latency=LatencyStats(5000, 0.1, 0.2, tail, tail)),
                "a": GroupSample(instructions=2e9),
                "b": GroupSample(instructions=1e9),
            },
        )
        return StepRecord(snap, decision, Allocation({}), 1e-5)

    records = [rec(0.5), rec(2.0), rec(0.9, Decision(note="x", moves={"a": frozenset({1})}))]
    m = summarize(records, groups, {"a": 2e9, "b": 2e9})
    assert m.slo_violation_rate == pytest.approx(1 / 3)
    assert m.slo_intervals_judged == 3  # a run with none judged has no rate (eval/report.py)
    assert m.tail_latency_ms == pytest.approx((0.5 + 2.0 + 0.9) / 3)
    # slowdowns 1 and 2 -> stddev 0.5 / mean 1.5
    assert m.unfairness == pytest.approx(0.5 / 1.5)
    assert m.weighted_speedup == pytest.approx(1.0 + 0.5)  # IPS 2e9 and 1e9 vs 2e9
    assert m.changes_per_minute == pytest.approx(1 / (3 / 60))
    assert math.isclose(m.decide_us_median, 10.0)


def test_a_run_without_batch_jobs_has_no_throughput_to_judge() -> None:
    """Its weighted speedup and batch IPS are NaN (shown "-", left out of the pairing),
    not 0, which read as every batch job stopped."""
    groups = {"lc": GroupSpec("lc", GroupKind.LC, SLO(99.0, 1.0))}
    lat = LatencyStats(5000, 0.1, 0.2, 0.5, 0.5)
    snap = Snapshot(0.0, 1.0, {"lc": GroupSample(instructions=1e9, latency=lat)})
    m = summarize([StepRecord(snap, KEEP, Allocation({}), 1e-5)], groups, {})
    assert math.isnan(m.weighted_speedup) and math.isnan(m.batch_ips)
    assert math.isnan(m.unfairness) and m.slo_violation_rate == 0.0


def test_a_plan_sent_again_is_not_an_allocation_change() -> None:
    groups = {"a": GroupSpec("a")}
    held = [Allocation({"a": {0: GroupAllocation(l3_mask=m)}}) for m in (0b11, 0b1111)]

    def rec(plan: int | None, holds: int) -> StepRecord:
        snap = Snapshot(0.0, 1.0, {"a": GroupSample(instructions=1e9)})
        decision = KEEP if plan is None else Decision(plan=held[plan].as_plan())
        return StepRecord(snap, decision, held[holds], 1e-5)

    # the first plan, the same plan three times, a new one, kept, then the first again
    records = [rec(0, 0), rec(0, 0), rec(0, 0), rec(1, 1), rec(None, 1), rec(0, 0)]
    m = summarize(records, groups, {"a": 1e9})
    assert m.changes_per_minute == pytest.approx(3 / (6 / 60))


def test_decision_time_leaves_out_the_intervals_a_slower_cadence_skips() -> None:
    """A policy deciding once a second on a node observed every 0.1 s: its decision time
    is its decisions' (1 ms here), not the median interval's (a skipped one: 1 us)."""
    groups = {"a": GroupSpec("a")}

    def rec(decision: Decision, seconds: float) -> StepRecord:
        snap = Snapshot(0.0, 0.1, {"a": GroupSample(instructions=1e9)})
        return StepRecord(snap, decision, Allocation({}), seconds)

    second = [rec(KEEP, 1e-3)] + [rec(WAIT, 1e-6) for _ in range(9)]
    assert summarize(second * 3, groups, {"a": 1e10}).decide_us_median == pytest.approx(1e3)
    skipped = [rec(WAIT, 2e-6)] * 4  # nothing decided: the intervals are all there is
    assert summarize(skipped, groups, {"a": 1e10}).decide_us_median == pytest.approx(2.0)


def test_window_requests_hold_fifty_beyond_the_percentile() -> None:
    from models.objectives import window_requests

    assert [window_requests(p) for p in (50.0, 95.0, 99.0, 99.9)] == [100, 1000, 5000, 50000]
    with pytest.raises(ValueError):
        window_requests(100.0)


def test_pooled_percentile_is_the_request_weighted_mean() -> None:
    a, b = LatencyStats(100, 0.5, 1.0, 2.0, 3.0), LatencyStats(300, 0.5, 2.0, 3.0, 4.0)
    assert pooled_percentile([a, b], 95.0) == pytest.approx((100 * 1.0 + 300 * 2.0) / 400)
    assert pooled_percentile([a], 99.0) == 2.0
    assert math.isnan(pooled_percentile([a, LatencyStats(3, *[math.nan] * 4)], 95.0))
    assert math.isnan(pooled_percentile([], 95.0))


GOOD = LatencyStats(100, 0.5, 0.9, 1.1, 2.0)  # p95 0.9: within a 1.0 target
BAD = LatencyStats(100, 0.5, 1.2, 1.5, 2.0)  # p95 1.2: over it


def test_slow_services_are_judged_on_pooled_windows() -> None:
    """100 requests per interval, p95 SLO: windows of 10 intervals (1,000 requests). Ten
    good intervals pass; ten alternating good/bad ones pool to a p95 of 1.05: violated."""
    series = [GOOD] * 10 + [GOOD, BAD] * 5
    windows = slo_windows(series, 95.0, 1.0, [0.1] * 20)
    assert [(w.first, w.last, w.requests, w.violated) for w in windows] == [
        (0, 9, 1000, False),
        (10, 19, 1000, True),
    ]
    assert windows[0].seconds == pytest.approx(1.0)
    # on its own, each bad interval would have counted: 5 of 20, not 10 of 20
    assert sum(w.intervals for w in windows if w.violated) == 10


def test_busy_services_are_judged_per_second_and_short_tails_join_the_last_window() -> None:
    busy = [LatencyStats(2000, 0.5, x, 2.0, 3.0) for x in (0.9, 1.2, 0.9)]
    # 1 s intervals: each one a window of its own
    assert [w.violated for w in slo_windows(busy, 95.0, 1.0, 1.0)] == [False, True, False]
    # 0.1 s intervals: pooled until a window spans 1 s, the last one joining it
    windows = slo_windows(busy * 7, 95.0, 1.0, 0.1)
    assert [(w.first, w.last, w.intervals) for w in windows] == [(0, 9, 10), (10, 20, 11)]
    assert windows[0].seconds == pytest.approx(1.0)
    # intervals without requests count for time, not for requests
    tail = [*busy, None, LatencyStats(0, *[math.nan] * 4), BAD]
    windows = slo_windows(tail, 95.0, 1.0, 1.0)
    assert [(w.first, w.last, w.intervals) for w in windows] == [(0, 0, 1), (1, 1, 1), (2, 5, 2)]
    assert slo_windows([BAD, BAD], 95.0, 1.0, 1.0)[0].intervals == 2  # one short window alone

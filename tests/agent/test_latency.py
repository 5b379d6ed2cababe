"""Latency feeds: exact percentiles from samples, Prometheus estimates from histograms."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from agent.latency import LatencyRecorder, histogram_quantile


def test_samples_give_exact_percentiles() -> None:
    rec = LatencyRecorder()
    rec.add_samples("svc", [float(i) for i in range(1, 1001)])
    stats = rec.drain("svc")
    assert stats.count == 1000
    assert stats.p50_ms == pytest.approx(500.5)
    assert stats.p99_ms == pytest.approx(990.01)
    assert stats.p999_ms == pytest.approx(999.001)


def test_drain_resets_the_interval() -> None:
    rec = LatencyRecorder()
    assert rec.drain("never") is None
    rec.add_samples("svc", [1.0])
    rec.drain("svc")
    empty = rec.drain("svc")
    assert empty.count == 0 and math.isnan(empty.p99_ms)


def test_drain_many_is_drain_of_each_group() -> None:
    feeds = {"a": [1.0, 2.0, 3.0], "b": [], "c": [5.0]}
    one, many = LatencyRecorder(), LatencyRecorder()
    assert many.drain_many(["a", "b"]) == {}  # nothing ever reported
    for rec in (one, many):
        for group, values in feeds.items():
            rec.add_samples(group, values)
    asked = ["a", "b", "never"]
    expected = {g: s for g in asked if (s := one.drain(g)) is not None}
    got = many.drain_many(asked)
    assert got.keys() == expected.keys() == {"a", "b"}
    for group in got:  # NaN percentiles of the empty interval compare by repr
        assert repr(got[group]) == repr(expected[group])
    assert many.drain("c").count == 1  # not asked: left for later
    assert many.drain("a").count == 0  # drained: a new interval


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0.5, 1.5), (0.25, 1.0), (0.95, 3.6), (1.0, 4.0)],
)
def test_histogram_quantile_matches_prometheus(q: float, expected: float) -> None:
    # buckets (0,1]:25 (1,2]:50 (2,4]:25 (4,inf]:0; PromQL interpolates linearly in a bucket
    assert histogram_quantile(q, [1.0, 2.0, 4.0, math.inf], [25, 50, 25, 0]) == pytest.approx(
        expected
    )


def test_rank_in_inf_bucket_returns_highest_finite_bound() -> None:
    assert histogram_quantile(0.99, [1.0, math.inf], [1, 9]) == 1.0


def test_histogram_and_samples_combine() -> None:
    rec = LatencyRecorder()
    rec.add_histogram("svc", [1.0, 2.0, math.inf], [50, 0, 0])
    rec.add_samples("svc", [1.5] * 50)
    stats = rec.drain("svc")
    assert stats.count == 100
    assert 1.0 < stats.p99_ms <= 2.0 and stats.p50_ms <= 1.0


def test_reservoir_bounds_memory_and_keeps_percentiles() -> None:
    rec = LatencyRecorder(max_samples=2000, seed=1)
    values = np.random.default_rng(0).exponential(1.0, 50_000)
    rec.add_samples("svc", values)
    stats = rec.drain("svc")
    assert stats.count == 50_000
    assert stats.p50_ms == pytest.approx(np.log(2), rel=0.1)
    assert stats.p95_ms == pytest.approx(-np.log(0.05), rel=0.1)


@pytest.mark.parametrize(
    ("bounds", "counts"),
    [
        ([], []),
        ([1.0, 1.0], [1, 1]),
        ([2.0, 1.0], [1, 1]),
        ([1.0], [-1]),
        ([1.0], [1, 2]),
        ([-math.inf, 1.0], [1, 1]),
        ([1.0, math.inf, math.inf], [1, 1, 1]),
    ],
)
def test_bad_histograms_are_rejected(bounds: list[float], counts: list[float]) -> None:
    with pytest.raises(ValueError):
        LatencyRecorder().add_histogram("svc", bounds, counts)


@pytest.mark.parametrize(
    "bounds",
    [
        [math.nan],
        [1.0, math.nan],
        [math.nan, 1.0],
        [1.0, math.nan, 2.0],
        [math.inf],
    ],
    ids=str,
)
def test_non_finite_histogram_bounds_are_rejected_and_nothing_is_kept(bounds) -> None:
    rec = LatencyRecorder()
    with pytest.raises(ValueError, match="bound"):
        rec.add_histogram("svc", bounds, [1.0] * len(bounds))
    assert rec.drain("svc") is None


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_samples_are_rejected_whole(bad: float) -> None:
    rec = LatencyRecorder()
    with pytest.raises(ValueError):
        rec.add_samples("svc", [1.0, bad])
    assert rec.drain("svc") is None


def test_bounds_may_not_change_within_an_interval() -> None:
    rec = LatencyRecorder()
    rec.add_histogram("svc", [1.0, 2.0], [1, 1])
    with pytest.raises(ValueError, match="changed"):
        rec.add_histogram("svc", [1.0, 3.0], [1, 1])


def test_concurrent_writers_lose_nothing() -> None:
    rec = LatencyRecorder()

    def push() -> None:
        for _ in range(200):
            rec.add_samples("svc", [1.0, 2.0])

    threads = [threading.Thread(target=push) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rec.drain("svc").count == 8 * 200 * 2

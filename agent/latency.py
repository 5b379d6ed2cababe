"""Per-group request-latency feeds turned into per-interval percentiles.

LC services report their latencies to the agent in one of two ways (docs/ARCHITECTURE.md,
"Data flow"): they push raw samples or histogram buckets over the agent's gRPC stream, or the
agent scrapes a Prometheus histogram they already export. Both land in a
:class:`LatencyRecorder`; once per observation interval the node drains it into a
:class:`~agent.types.LatencyStats` (count, p50/p95/p99/p99.9).

Raw samples give exact percentiles. Histograms give Prometheus ``histogram_quantile``
estimates (linear interpolation inside the bucket holding the rank); when an interval has
both, samples are folded into the histogram's buckets so one estimator answers. Memory is
bounded: beyond ``max_samples`` per group and interval a uniform reservoir is kept, which
leaves percentiles unbiased.
"""

from __future__ import annotations

import itertools
import math
import random
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from agent.types import LatencyStats

_QUANTILES = tuple(p / 100.0 for p in LatencyStats.PERCENTILES)
# Request counts travel as int64 (LatencyStats.count): an interval's total must stay below
# 2^63, or every later observation of the group could not be sent.
MAX_COUNT = 2.0**63


def histogram_quantile(q: float, upper_bounds: Sequence[float], counts: Sequence[float]) -> float:
    """Prometheus' ``histogram_quantile`` over per-bucket (not cumulative) counts.

    ``upper_bounds`` are increasing bucket limits, the last may be +Inf. A rank in the +Inf
    bucket returns the highest finite bound, as Prometheus does.
    """
    total = float(sum(counts))
    if total <= 0:
        return float("nan")
    rank = q * total
    cumulative = 0.0
    lower = 0.0
    for bound, count in zip(upper_bounds, counts, strict=True):
        if count > 0 and cumulative + count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - cumulative) / count
        cumulative += count
        if not math.isinf(bound):
            lower = bound
    return lower


@dataclass
class _GroupFeed:
    samples: list[float] = field(default_factory=list)
    seen: int = 0  # samples offered this interval (the reservoir keeps a subset)
    bounds: tuple[float, ...] | None = None
    buckets: np.ndarray | None = None


class LatencyRecorder:
    """Thread-safe accumulation of request latencies per group, drained per interval.

    Args:
        max_samples: raw samples kept per group and interval (reservoir beyond that).
        seed: seed of the reservoir's random choices (reproducible tests).
    """

    def __init__(self, max_samples: int = 65536, seed: int | None = None) -> None:
        if max_samples < 1:
            raise ValueError("max_samples must be >= 1")
        self.max_samples = max_samples
        self._feeds: dict[str, _GroupFeed] = {}
        self._lock = threading.Lock()
        self._rng = random.Random(seed)

    def add_samples(self, group: str, latencies_ms: Sequence[float]) -> None:
        """Record completed requests' latencies (milliseconds)."""
        values = [float(v) for v in latencies_ms]
        for v in values:
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"latency sample {v!r} ms is not a finite non-negative number")
        with self._lock:
            feed = self._feeds.setdefault(group, _GroupFeed())
            for v in values:
                feed.seen += 1
                if len(feed.samples) < self.max_samples:
                    feed.samples.append(v)
                else:  # Algorithm R: each offered sample kept with probability k/seen
                    j = self._rng.randrange(feed.seen)
                    if j < self.max_samples:
                        feed.samples[j] = v

    def add_histogram(
        self, group: str, upper_bounds_ms: Sequence[float], counts: Sequence[float]
    ) -> None:
        """Record a histogram delta: per-bucket counts of requests with latency <= bound.

        The bounds must be increasing and stay the same for a group within an interval.
        """
        bounds = tuple(float(b) for b in upper_bounds_ms)
        cnt = np.asarray(counts, dtype=float)
        if not bounds or len(bounds) != len(cnt):
            raise ValueError(
                f"histogram needs one count per bound ({len(bounds)} bounds, {len(cnt)} counts)"
            )
        # NaN compares False both ways, so the order check below would let it through; a
        # +Inf bound may only close the histogram (Prometheus' last bucket), and a histogram
        # of +Inf alone places no request anywhere.
        if not (all(map(math.isfinite, bounds[:-1])) and -math.inf < bounds[-1] <= math.inf):
            raise ValueError("histogram bounds must be finite numbers (the last may be +Inf)")
        if not math.isfinite(bounds[0]):
            raise ValueError("a histogram needs a finite bound")
        if any(b2 <= b1 for b1, b2 in itertools.pairwise(bounds)) or bounds[0] < 0:
            raise ValueError("histogram bounds must be non-negative and strictly increasing")
        if (cnt < 0).any() or not np.isfinite(cnt).all():
            raise ValueError("histogram counts must be finite and non-negative")
        with self._lock:
            feed = self._feeds.get(group) or _GroupFeed()
            held = 0.0 if feed.buckets is None else float(feed.buckets.sum())
            if held + float(cnt.sum()) + feed.seen >= MAX_COUNT:
                # Checked before anything is stored: a refused report leaves the interval
                # as it was.
                raise ValueError(
                    f"group {group!r}: histogram counts total {held + float(cnt.sum()):g} "
                    "requests this interval, beyond int64"
                )
            if feed.bounds is not None and feed.bounds != bounds:
                raise ValueError(f"group {group!r}: histogram bounds changed within an interval")
            self._feeds[group] = feed
            if feed.bounds is None:
                feed.bounds, feed.buckets = bounds, cnt.copy()
            else:
                feed.buckets += cnt

    def drain(self, group: str) -> LatencyStats | None:
        """Percentiles of everything recorded for ``group`` since the last drain.

        None when the group never reported; an empty LatencyStats when it reported before
        but had no requests this interval.
        """
        with self._lock:
            feed = self._feeds.get(group)
            if feed is None:
                return None
            self._feeds[group] = _GroupFeed()
        return _stats(feed)

    def drain_many(self, groups: Iterable[str]) -> dict[str, LatencyStats]:
        """:meth:`drain` for each of ``groups`` that ever reported, under one lock (every
        Observe drains every group; most nodes have no reports at all)."""
        with self._lock:
            feeds = self._feeds
            if not feeds:
                return {}
            taken = {}
            for group in groups:
                feed = feeds.get(group)
                if feed is not None:
                    taken[group] = feed
                    feeds[group] = _GroupFeed()
        return {group: _stats(feed) for group, feed in taken.items()}

    def forget(self, group: str) -> None:
        with self._lock:
            self._feeds.pop(group, None)

    def forget_all(self) -> None:
        with self._lock:
            self._feeds.clear()


def _stats(feed: _GroupFeed) -> LatencyStats:
    if feed.bounds is None:
        if not feed.samples:
            return LatencyStats.empty()
        values = np.quantile(np.asarray(feed.samples), _QUANTILES)
        return LatencyStats(feed.seen, *(float(v) for v in values))
    buckets = feed.buckets.copy()
    if feed.samples:
        # Fold samples into the histogram, scaled up when the reservoir dropped some.
        idx = np.searchsorted(np.asarray(feed.bounds), np.asarray(feed.samples), side="left")
        idx = np.minimum(idx, len(buckets) - 1)
        np.add.at(buckets, idx, feed.seen / len(feed.samples))
    count = int(np.rint(buckets.sum()))
    if count == 0:
        return LatencyStats.empty()
    values = [histogram_quantile(q, feed.bounds, buckets) for q in _QUANTILES]
    return LatencyStats(count, *values)

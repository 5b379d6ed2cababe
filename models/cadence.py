"""Deciding at a slower cadence than the node is observed: :class:`Every` wraps any controller
so it decides every ``k``-th interval from the merged snapshots of those intervals.

A policy trained at one decision a second then runs at its own cadence on a node observed
every 0.1 s (the catalogue's ``decide_s`` option, models/catalogue.py).
"""

from __future__ import annotations

import dataclasses

from agent.types import GroupSample, LatencyStats, Snapshot, new_sample
from models.controller import ControlContext, Controller, Decision

# What Every answers between its decisions: KEEP's meaning, as an object of its own, so a
# controller's decision time (eval/metrics.py, the tuner's histogram) counts its decisions,
# not the intervals skipped (nine of ten at one decision a second, observed every 0.1 s).
WAIT = Decision()


def decided(decision: Decision | None) -> bool:
    """Whether ``decision`` came from a controller's decide() (not a slower cadence's WAIT
    between two of them): what a decision's time is measured over."""
    return decision is not WAIT


class Every(Controller):
    """Runs ``inner`` at a slower cadence: it decides every ``k``-th interval from the
    interval's snapshots merged into one (counters summed, occupancy the latest, latency
    percentiles request-weighted means — an approximation; counts exact), and the
    allocation is kept in between. So a policy trained at one decision a second runs at its
    own cadence on a node observed every 0.1 s (spec option ``decide_s``). Each snapshot
    is added to the merge as it comes (:class:`Merge`), so a decision does not wait for
    ``k`` snapshots to be summed.

    The first decision after :meth:`start` comes after one interval, not ``k``: the node
    as found (unpartitioned on first sight) may already miss an SLO, and waiting a whole
    period would let that miss fill the first SLO window (measured: docs/TRAINING.md,
    "The shield's cliff memory", the demo)."""

    def __init__(self, inner: Controller, k: int) -> None:
        if k < 1:
            raise ValueError("decide_s must be at least one interval")
        self.inner, self.k = inner, int(k)
        self.name = inner.name
        self.needs_tasks = inner.needs_tasks
        self._pending = Merge()
        self._first = True  # the first decision after start: after one interval

    def start(self, ctx: ControlContext) -> Decision:
        self._pending = Merge()
        self._first = True
        return self.inner.start(ctx)

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        self._pending.add(snapshot)
        if self._pending.count < self.k and not self._first:
            return WAIT
        self._first = False
        merged, self._pending = self._pending.snapshot(), Merge()
        return self.inner.decide(merged, ctx)


class Merge:
    """Consecutive snapshots merged into one interval as they come (see :class:`Every`):
    per group, counters summed (None when any interval lacked it), occupancy the latest,
    latency percentiles the request-weighted means of the intervals with requests. Groups
    are those of the latest snapshot."""

    __slots__ = ("_groups", "_interval", "_last", "_vanished", "count")

    def __init__(self) -> None:
        self.count = 0
        self._interval = 0.0
        self._last: Snapshot | None = None
        self._vanished: frozenset[str] = frozenset()
        # per group: [six counter sums, requests, four weighted percentile sums]
        self._groups: dict[str, list] = {}

    def add(self, snap: Snapshot) -> None:
        self.count += 1
        self._interval += snap.interval_s
        self._last = snap
        if snap.vanished:
            self._vanished = self._vanished.union(snap.vanished)
        acc = self._groups
        for g, x in snap.groups.items():
            a = acc.get(g)
            if a is None:
                a = acc[g] = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, 0.0, 0.0, 0.0]
            # (sum() starts from 0 too: the same additions in the same order)
            for i, v in enumerate(
                (x.instructions, x.cycles, x.llc_references, x.llc_misses, x.memory_bytes,
                 x.memory_local_bytes)
            ):  # fmt: skip
                s = a[i]
                a[i] = None if v is None or s is None else s + v
            lat = x.latency
            if lat is not None and lat.count:
                n = lat.count
                a[6] += n
                a[7] += lat.p50_ms * n
                a[8] += lat.p95_ms * n
                a[9] += lat.p99_ms * n
                a[10] += lat.p999_ms * n

    def snapshot(self) -> Snapshot:
        """The snapshots added so far as one (at least one must have been)."""
        last = self._last
        if last is None:
            raise ValueError("no snapshot to merge")
        groups: dict[str, GroupSample] = {}
        for g, x in last.groups.items():
            a = self._groups[g]
            n = a[6]
            latency = x.latency
            if n:
                latency = LatencyStats(n, a[7] / n, a[8] / n, a[9] / n, a[10] / n)
            groups[g] = new_sample(  # GroupSample(...) in field order, built faster
                a[0], a[1], a[2], a[3], x.llc_occupancy_bytes, a[4], a[5], latency
            )
        return dataclasses.replace(
            last, interval_s=self._interval, groups=groups, vanished=self._vanished
        )


def merge_snapshots(snaps: list[Snapshot]) -> Snapshot:
    """Consecutive snapshots as one interval (see :class:`Merge`)."""
    merge = Merge()
    for snap in snaps:
        merge.add(snap)
    return merge.snapshot()

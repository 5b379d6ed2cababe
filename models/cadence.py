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
    own cadence on a node observed every 0.1 s (spec option ``decide_s``).

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
        self._pending: list[Snapshot] = []
        self._first = True  # the first decision after start: after one interval

    def start(self, ctx: ControlContext) -> Decision:
        self._pending = []
        self._first = True
        return self.inner.start(ctx)

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        self._pending.append(snapshot)
        if len(self._pending) < self.k and not self._first:
            return WAIT
        self._first = False
        merged, self._pending = merge_snapshots(self._pending), []
        return self.inner.decide(merged, ctx)


def _sum(values: tuple[float | None, ...]) -> float | None:
    return None if None in values else float(sum(values))  # type: ignore[arg-type]


def merge_snapshots(snaps: list[Snapshot]) -> Snapshot:
    """Consecutive snapshots as one interval (see :class:`Every`)."""
    groups: dict[str, GroupSample] = {}
    for g in snaps[-1].groups:
        samples = [s.groups[g] for s in snaps if g in s.groups]
        # each summed counter's values, field by field (one pass over the samples)
        ins, cyc, refs, misses, mem, local = zip(
            *[(x.instructions, x.cycles, x.llc_references, x.llc_misses, x.memory_bytes,
               x.memory_local_bytes) for x in samples],
            strict=True,
        )  # fmt: skip
        lat = [x.latency for x in samples if x.latency is not None and x.latency.count]
        latency = samples[-1].latency
        if lat:
            n = sum(x.count for x in lat)
            latency = LatencyStats(
                n,
                sum(x.p50_ms * x.count for x in lat) / n,
                sum(x.p95_ms * x.count for x in lat) / n,
                sum(x.p99_ms * x.count for x in lat) / n,
                sum(x.p999_ms * x.count for x in lat) / n,
            )
        groups[g] = new_sample(  # GroupSample(...) in field order, built faster
            _sum(ins),
            _sum(cyc),
            _sum(refs),
            _sum(misses),
            samples[-1].llc_occupancy_bytes,
            _sum(mem),
            _sum(local),
            latency,
        )
    return dataclasses.replace(
        snaps[-1],
        interval_s=sum(s.interval_s for s in snaps),
        groups=groups,
        vanished=frozenset().union(*(s.vanished for s in snaps)),
    )

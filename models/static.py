"""Static allocations: the catbench-style offline sweep and CoPart's best static (ST).

:class:`StaticController` ("Simple Cache Partitioning for Networked Workloads", CMU 2017,
as summarised in docs/CONTROLLERS.md, static): the LC service (the "mite") gets a contiguous low
range of ways from bit 0; every other group shares the disjoint remainder (mite 2 ways =
0x3, contenders 0xffffc on 20 ways); no MBA (every MB at its maximum). :func:`calibrate`
sweeps the mite's ways from 1 to L-1 on a node under contention at the target load,
measuring the SLO percentile (p99.9 in catbench) and the contenders' throughput over one
window per point (largest mite first, so backlog from overloaded points cannot leak in),
and picks the smallest way count at the start of the flat (best) tail-latency region
plus one way of slack (offline measurement may misrepresent the online workload). The
controller then holds that allocation; it has no online control.

Flatness criterion (our reading; the write-up gives none numerically): y(k) is the
SLO-percentile latency measured over one window at k ways, s(k) its 3-point running median
(a tail percentile of a finite window is noisy; one outlier must not move the knee), and
the tail level y* the median of s over half the sweep centred on the last minimum of s
(the minimum of a noisy curve itself would be biased low). When the tail falls with the
mite's ways all the way, as in catbench, that window is the upper half of the sweep (the
largest mites). When it rises again at the top — a contender squeezed into the last ways
misses so much that it saturates memory bandwidth (docs/SIMULATOR.md, the U-shape) — the
window sits around the best way counts instead, so the knee is not pushed to the worst
end. The flat region is the run of way counts ending at that minimum with every
s(k) <= y* * (1 + tolerance) + abs_tolerance_ms (default tolerance 10%); the knee is its
first. Points where no request completed count as infinitely slow.

:class:`BestStatic` (CoPart, EuroSys'19 section 6.1, "ST"): the single allocation with the
best objective found by bounded exhaustive search (:mod:`models.search`) — on a node that
offers ground truth (:func:`agent.node.ground_truth`) by it, on any other node by
measurement (each candidate applied and observed for a few intervals; batch slowdowns
against IPS measured once with each group given every way and full bandwidth while the
others are confined to the top way at the lowest MB level). A reference, not a deployable
controller.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from agent.node import Clock, Node, ground_truth
from agent.types import (
    SLO,
    AllocationPlan,
    GroupKind,
    NodeCapabilities,
    Snapshot,
    contiguous_mask,
)
from models.allocation import full_allocation, mb_level, plan_from, shared_plan
from models.controller import KEEP, ControlContext, Controller, Decision, require
from models.objectives import Objective, Outcome, get_objective, slowdown
from models.oracle import truth_score
from models.search import SearchResult, search

DEFAULT_TOLERANCE = 0.10


@dataclass(frozen=True)
class SweepPoint:
    """One point of the sweep: the mite at ``ways`` ways."""

    ways: int
    latency_ms: float  # the SLO percentile over the measurement window (inf: no answers)
    contender_ips: float  # contenders' summed instructions/s over the window


@dataclass(frozen=True)
class Sweep:
    """The result of :func:`calibrate`: the curve, its knee and the chosen way count."""

    lc_group: str
    slo: SLO
    points: tuple[SweepPoint, ...]
    knee: int
    ways: int
    tolerance: float
    load: float | None = None

    @property
    def curve(self) -> dict[int, float]:
        return {p.ways: p.latency_ms for p in self.points}


def knee(
    latencies: Mapping[int, float],
    tolerance: float = DEFAULT_TOLERANCE,
    abs_tolerance_ms: float = 0.0,
) -> int:
    """The smallest way count from which the (3-point median smoothed) curve stays within
    the flat band around the tail level (see the module docstring)."""
    if not latencies:
        raise ValueError("no sweep points")
    ks = sorted(latencies)
    ys = [latencies[k] if not math.isnan(latencies[k]) else math.inf for k in ks]
    smooth = [statistics.median(ys[max(0, i - 1) : i + 2]) for i in range(len(ys))]
    n = len(smooth)
    best = max(i for i in range(n) if smooth[i] == min(smooth))  # the last minimum
    half = n - n // 2
    start = min(max(best - half // 2, 0), n - half)  # the upper half if best is the end
    level = statistics.median(smooth[start : start + half])
    if math.isinf(level):
        return ks[-1]
    band = level * (1.0 + tolerance) + abs_tolerance_ms
    k0 = ks[best]
    for i in range(best - 1, -1, -1):
        if smooth[i] > band:
            break
        k0 = ks[i]
    return k0


def mite_plan(
    lc_group: str, ways: int, groups: Sequence[str], caps: NodeCapabilities
) -> AllocationPlan:
    """The mite at ``ways`` low ways, every other group sharing the rest; MB at maximum."""
    l3 = caps.l3
    if l3 is None:
        raise ValueError("node has no L3 allocation")
    low = (l3.cbm_mask & -l3.cbm_mask).bit_length() - 1
    least = max(1, l3.min_cbm_bits)
    if not least <= ways <= l3.num_ways - least:
        raise ValueError(
            f"ways must be in {least}..{l3.num_ways - least} on this node (the LC group's "
            f"own ways; the other groups share the rest), got {ways}"
        )
    mite = contiguous_mask(ways, low)
    rest = l3.cbm_mask & ~mite
    masks = {g: (mite if g == lc_group else rest) for g in groups}
    mb = caps.mba.max_bandwidth if caps.mba else None
    return plan_from(masks, dict.fromkeys(groups, mb), caps)


def _wait(clock: Clock | None, seconds: float) -> None:
    if clock is not None:
        clock.advance(seconds)
    else:
        time.sleep(seconds)


def check_sweep(
    *, measure_s: float, warmup_s: float, tolerance: float, abs_tolerance_ms: float, slack: int
) -> None:
    """ValueError for sweep settings out of range (:func:`calibrate`'s keywords), before
    a sweep runs rather than after it."""
    if not (measure_s > 0 and warmup_s >= 0):
        raise ValueError("need measure_s > 0 and warmup_s >= 0")
    require(slack >= 0, "slack", slack, ">= 0 ways")
    require(tolerance >= 0 and abs_tolerance_ms >= 0, "tolerance and abs_tolerance_ms",
            (tolerance, abs_tolerance_ms), ">= 0")  # fmt: skip


def calibrate(
    node: Node,
    clock: Clock | None,
    lc_group: str,
    *,
    load: float | None = None,
    set_load: Callable[[float], None] | None = None,
    measure_s: float = 5.0,
    warmup_s: float = 0.3,
    tolerance: float = DEFAULT_TOLERANCE,
    abs_tolerance_ms: float = 0.0,
    slack: int = 1,
) -> Sweep:
    """Sweep the mite's ways 1..L-1 on ``node`` under its current contention.

    ``load``/``set_load``: the target load, and a callback that makes the load generator
    offer it before the sweep (on a simulated node the scenario's load is the target load).
    Each point: apply, wait ``warmup_s`` (caches refill, queues drain), then measure one
    window of ``measure_s``. ``clock`` None means a real node: the sweep sleeps instead.
    Leaves the node holding the chosen allocation.
    """
    groups = node.groups()
    if lc_group not in groups:
        raise ValueError(f"no group {lc_group!r} on the node; have {sorted(groups)}")
    spec = groups[lc_group]
    if spec.kind is not GroupKind.LC or spec.slo is None:
        raise ValueError(f"group {lc_group!r} is not an LC group with an SLO")
    check_sweep(measure_s=measure_s, warmup_s=warmup_s, tolerance=tolerance,
                abs_tolerance_ms=abs_tolerance_ms, slack=slack)  # fmt: skip
    caps = node.capabilities()
    if caps.l3 is None:
        raise ValueError("node has no L3 allocation to sweep")
    if set_load is not None and load is not None:
        set_load(load)
    names = list(groups)
    least = max(1, caps.l3.min_cbm_bits)
    points = []
    # Largest mite first: an overloaded small-mite point leaves a request backlog behind,
    # which must not leak into the flat region's measurements.
    for ways in range(caps.l3.num_ways - least, least - 1, -1):
        node.apply(mite_plan(lc_group, ways, names, caps))
        _wait(clock, warmup_s)
        node.observe()
        # One observe over the whole window: the percentile of every request in it (p99.9
        # needs thousands of requests; per-interval percentiles would be noise).
        _wait(clock, measure_s)
        snap = node.observe()
        lat = _latency(snap, lc_group, spec.slo)
        ips = sum(
            (s.instructions or 0.0) / snap.interval_s
            for g, s in snap.groups.items()
            if g != lc_group and snap.interval_s > 0
        )
        points.append(SweepPoint(ways, lat if not math.isnan(lat) else math.inf, ips))
    points.reverse()
    k = knee({p.ways: p.latency_ms for p in points}, tolerance, abs_tolerance_ms)
    chosen = min(k + slack, caps.l3.num_ways - least)
    node.apply(mite_plan(lc_group, chosen, names, caps))
    return Sweep(lc_group, spec.slo, tuple(points), k, chosen, tolerance, load)


def _latency(snap: Snapshot, group: str, slo: SLO) -> float:
    sample = snap.groups.get(group)
    if sample is None or sample.latency is None or sample.latency.count == 0:
        return math.nan
    return sample.latency.percentile(slo.percentile)


class StaticController(Controller):
    """Holds the catbench allocation: ``lc_group`` at ``ways`` low ways, the rest shared.

    With ``lc_group`` None (a node without an LC group: no mite to protect) every group
    shares the whole cache at full bandwidth, as unpartitioned. A node that never had
    ``lc_group`` is a configuration error, refused at start (the tuner refuses such a
    fallback before it is needed); when the group vanishes after the controller has held
    it, there is no mite left to protect either: every group shares the cache until the
    group is back (its reserved ways would otherwise stay idle), and the note says so.
    """

    name = "static"

    def __init__(self, lc_group: str | None, ways: int = 0) -> None:
        if lc_group is not None and int(ways) < 1:
            raise ValueError(f"static: the mite {lc_group!r} needs at least one way, got {ways}")
        self.lc_group = lc_group
        self.ways = int(ways)
        self._groups: tuple[str, ...] = ()
        self._held = False  # lc_group was on the node at a start

    @classmethod
    def from_sweep(cls, sweep: Sweep) -> StaticController:
        return cls(sweep.lc_group, sweep.ways)

    def start(self, ctx: ControlContext) -> Decision:
        if self.lc_group is not None and self.lc_group in ctx.groups:
            self._held = True
        elif self.lc_group is not None and not self._held:
            raise ValueError(
                f"static controller calibrated for {self.lc_group!r}, which is not a group "
                f"on this node ({sorted(ctx.groups)})"
            )
        # Set only once the groups are accepted: a refused start is tried again next time.
        self._groups = tuple(ctx.groups)
        if not self._groups:
            return KEEP
        caps = ctx.usable  # the ways another tool holds exclusively left out
        if self.lc_group is None or self.lc_group not in ctx.groups:
            plan = shared_plan(self._groups, caps)
            why = "no LC group" if self.lc_group is None else f"{self.lc_group} is gone"
            return Decision(plan, note=f"static: {why}, every group shares the cache")
        if caps.l3 is not None and self.ways > caps.l3.num_ways - max(1, caps.l3.min_cbm_bits):
            caps = ctx.capabilities  # the calibrated ways do not fit: the guard trims them
        plan = mite_plan(self.lc_group, self.ways, self._groups, caps)
        return Decision(plan, note=f"static: {self.lc_group} at {self.ways} ways")

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        if tuple(ctx.groups) != self._groups:
            return self.start(ctx)
        return KEEP


# --------------------------------------------------------------------------- best static


def measure_outcome(
    node: Node,
    clock: Clock | None,
    plan: AllocationPlan,
    ips_full: Mapping[str, float],
    *,
    intervals: int = 3,
    warmup: int = 1,
    interval_s: float = 0.1,
) -> Outcome:
    """Apply ``plan`` and measure batch slowdowns and LC latencies over ``intervals``."""
    groups = node.groups()
    node.apply(plan)
    for _ in range(warmup):
        _wait(clock, interval_s)
    node.observe()
    ips: dict[str, list[float]] = {g: [] for g in groups}
    lat: dict[str, list[float]] = {g: [] for g in groups}
    for _ in range(intervals):
        _wait(clock, interval_s)
        snap = node.observe()
        for g, spec in groups.items():
            s = snap.groups.get(g)
            if s is None:
                continue
            if spec.kind is GroupKind.LC and spec.slo is not None:
                x = _latency(snap, g, spec.slo)
                lat[g].append(x if not math.isnan(x) else math.inf)
            elif s.instructions is not None and snap.interval_s > 0:
                ips[g].append(s.instructions / snap.interval_s)
    slow, lats, targets = [], [], []
    for g, spec in groups.items():
        if spec.kind is GroupKind.LC and spec.slo is not None:
            lats.append(statistics.median(lat[g]) if lat[g] else math.inf)
            targets.append(spec.slo.target_ms)
        elif spec.kind is GroupKind.BATCH and ips_full.get(g, 0) > 0 and ips[g]:
            slow.append(slowdown(ips_full[g], statistics.fmean(ips[g])))
    return Outcome(tuple(slow), tuple(lats), tuple(targets))


def profile_full(
    node: Node,
    clock: Clock | None,
    *,
    intervals: int = 2,
    warmup: int = 1,
    interval_s: float = 0.1,
) -> dict[str, float]:
    """IPS of each batch group given every way and full bandwidth while the other groups
    are confined to the top way at the lowest MB level (CoPart section 5.4.1's "full
    resources" run, done online)."""
    groups = node.groups()
    caps = node.capabilities()
    top = _top_ways(caps)
    low_mb = mb_level(caps, 0.0)
    full = full_allocation(caps)
    out = {}
    for g, spec in groups.items():
        if spec.kind is not GroupKind.BATCH:
            continue
        masks = {h: (full.l3_mask if h == g else top) for h in groups}
        mbs = {h: (full.mb if h == g else low_mb) for h in groups}
        node.apply(plan_from(masks, mbs, caps))
        for _ in range(warmup):
            _wait(clock, interval_s)
        node.observe()
        total = 0.0
        for _ in range(intervals):
            _wait(clock, interval_s)
            snap = node.observe()
            s = snap.groups.get(g)
            if s is not None and s.instructions is not None and snap.interval_s > 0:
                total += s.instructions / snap.interval_s
        out[g] = total / intervals
    return out


def _top_ways(caps: NodeCapabilities) -> int:
    """The highest min_cbm_bits ways of the cache (where squeezed groups are confined)."""
    l3 = caps.l3
    least = max(1, l3.min_cbm_bits)
    high = l3.cbm_mask.bit_length()
    return contiguous_mask(least, high - least)


class BestStatic(Controller):
    """CoPart's ST: the best static allocation by exhaustive search, then held.

    Call :meth:`fit` before driving (or give its ``result``): on a node that offers ground
    truth it scores candidates by it; on any other node by measurement (slow: ``intervals +
    warmup`` intervals per candidate; bound it with ``max_evals``). The plan is for the
    groups searched: while the node's groups differ (one gone, or one the search never
    saw) every group shares the cache, as unpartitioned, and the note says so; the plan
    is held again once the groups are those searched (searching again needs the node).
    """

    name = "best_static"

    def __init__(
        self,
        objective: str | Objective | None = None,
        *,
        max_evals: int = 600,
        result: SearchResult | None = None,
    ):
        require(max_evals >= 1, "max_evals", max_evals, ">= 1")
        self.objective = objective
        self.max_evals = max_evals
        self.result = result  # the search's answer: from :meth:`fit`, or given
        self._groups: tuple[str, ...] = ()

    def fit(
        self,
        node: Node,
        clock: Clock | None = None,
        *,
        intervals: int = 3,
        warmup: int = 1,
        interval_s: float = 0.1,
    ) -> SearchResult:
        groups = node.groups()
        has_lc = any(g.kind is GroupKind.LC for g in groups.values())
        obj = get_objective(self.objective, has_lc)
        caps = node.capabilities()
        truth = ground_truth(node)
        if truth is not None:
            score = truth_score(truth, obj)
        else:
            ips_full = profile_full(node, clock, interval_s=interval_s)

            def score(plan: AllocationPlan) -> float:
                return obj(
                    measure_outcome(
                        node,
                        clock,
                        plan,
                        ips_full,
                        intervals=intervals,
                        warmup=warmup,
                        interval_s=interval_s,
                    )
                )

        self.result = search(score, groups, caps, max_evals=self.max_evals)
        self._groups = ()
        return self.result

    def start(self, ctx: ControlContext) -> Decision:
        if self.result is None:
            raise RuntimeError("BestStatic.fit(node) must run before the controller starts")
        self._groups = tuple(ctx.groups)
        searched, have = set(self.result.plan.groups), set(self._groups)
        if have == searched:
            return Decision(self.result.plan, note=f"best static: score {self.result.score:.4g}")
        # The search's plan is for other groups: re-sent, the node would refuse it (a
        # group gone) or a new group would overlap every other (it holds every way).
        # Searching again needs the node; until the searched groups are back, every group
        # shares the cache, as unpartitioned.
        plan = shared_plan(self._groups, ctx.capabilities)
        why = "; ".join(
            f"{', '.join(sorted(names))} {verb}"
            for names, verb in ((searched - have, "gone"), (have - searched, "not searched"))
            if names
        )
        return Decision(
            plan,
            note=f"best static: {why}, every group shares the cache until the searched "
            "groups are back",
        )

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        if tuple(ctx.groups) != self._groups:
            return self.start(ctx)
        return KEEP

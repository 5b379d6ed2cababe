"""What a controller achieved over a run: the figures every comparison reports.

Definitions (shared by the demo, ``rdtune eval`` and the RL evaluation):
- SLO violation rate: fraction of intervals (with requests) that fall in an *SLO window*
  where the LC group's latency at its SLO percentile exceeded the target. A window pools
  consecutive intervals until it spans :data:`models.objectives.SLO_WINDOW_S` (1 s) and
  holds :func:`models.objectives.window_requests` (50 requests beyond the percentile:
  1,000 for p95, 5,000 for p99), so a percentile is judged on enough requests and time to
  mean something — a p95 over the 20 requests a slow service answers in 0.1 s, or over one
  short burst of a busy one, is mostly sampling noise. With 1 s control intervals a busy
  service's window is one interval. The window's percentile is the request-weighted mean
  of its intervals' percentiles (as :func:`models.cadence.merge_snapshots` merges
  intervals).
- Tail latency: mean over intervals of the latency at the SLO percentile (ms).
- Slowdown of a batch group: reference IPS / mean IPS over the run, the reference being its
  IPS with full resources alone (CoPart, EuroSys'19 section 2).
- Unfairness: CoPart's stddev / mean of the batch groups' slowdowns.
- Weighted speedup: sum over batch groups of mean IPS / reference IPS.
- Allocation changes per minute: intervals whose decision changed the allocation (moved
  tasks, or a plan that left the node holding something else than before); a plan the
  node already holds, sent again, is not a change.
- Normalised tail: per LC group, its mean tail over the mean tail of the same service alone
  on the machine (same load, seed and interval, every way and full bandwidth, over the
  run's length), averaged over LC groups (:func:`sim_alone_tails` measures the reference
  on a simulated node). A run that overloaded an LC service (its tail infinite: the queue
  grew without bound) has an infinite normalised tail, as its mean tail is: the report
  counts such runs apart rather than average them (eval/report.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.slo import judged, slo_met
from agent.types import GroupKind, GroupSpec, LatencyStats
from models import objectives
from models.cadence import decided
from models.controller import StepRecord
from models.objectives import SLO_WINDOW_S, window_requests


@dataclass(frozen=True)
class RunMetrics:
    slo_violation_rate: float
    tail_latency_ms: float
    unfairness: float
    weighted_speedup: float
    batch_ips: float
    changes_per_minute: float
    decide_us_median: float
    slo_window_s: float = math.nan  # mean length of the SLO windows judged
    # intervals judged against an SLO: 0 means the run has no violation rate (the rate
    # above is 0 then), whatever its tail
    slo_intervals_judged: float = 0.0


@dataclass(frozen=True)
class MetricScale:
    """A metric of :class:`RunMetrics` as its definition above gives it: the unit its values
    are in (results.json keeps them so; a report may scale them, a rate to percent), and
    the values it can take. A Student-t interval knows nothing of these (a mean violation
    rate of 10% over three seeds can have an interval from -15% to 35%), so the report
    cuts what it shows to them (eval/report.py)."""

    unit: str
    low: float = 0.0
    high: float = math.inf


METRIC_SCALES: dict[str, MetricScale] = {
    "slo_violation_rate": MetricScale("fraction", 0.0, 1.0),  # of the intervals judged
    # each of these a time, a count per time or a ratio of non-negative quantities
    "tail_latency_ms": MetricScale("ms"),
    "tail_normalized": MetricScale("ratio"),
    "unfairness": MetricScale("ratio"),
    "weighted_speedup": MetricScale("ratio"),
    "batch_ips": MetricScale("instructions/s"),
    "changes_per_minute": MetricScale("per minute"),
    "decide_us_median": MetricScale("us"),
}


def pooled_percentile(stats: Sequence[LatencyStats], percentile: float) -> float:
    """The latency at ``percentile`` over several intervals: the request-weighted mean of
    their percentiles (NaN when one is unknown: requests without answers)."""
    n = sum(s.count for s in stats)
    if not n:
        return math.nan
    return sum(s.count * s.percentile(percentile) for s in stats) / n


@dataclass(frozen=True)
class SloWindow:
    """Consecutive intervals ``first..last`` (indices into the run) judged together."""

    first: int
    last: int
    intervals: int  # intervals with requests in it
    requests: int
    seconds: float
    violated: bool


def slo_windows(
    latencies: Sequence[LatencyStats | None],
    percentile: float,
    target_ms: float,
    interval_s: float | Sequence[float],
    window_s: float = SLO_WINDOW_S,
) -> list[SloWindow]:
    """One LC group's run cut into SLO windows (see the module docstring): intervals pooled
    in order until a window spans ``window_s`` seconds (``interval_s``: each interval's
    length, or one for all) and holds :func:`~models.objectives.window_requests`; a last
    window short of either joins the one before (or stands alone when it is the only one).
    Intervals without requests are not judged. A window is violated when its
    :func:`pooled_percentile` exceeds ``target_ms`` or is unknown."""
    need = window_requests(percentile)
    lengths = (
        [float(interval_s)] * len(latencies)
        if isinstance(interval_s, int | float)
        else list(interval_s)
    )
    spans: list[list[int]] = []
    cur: list[int] = []
    count, span = 0, 0.0
    for i, lat in enumerate(latencies):
        span += lengths[i]
        if not judged(lat):
            continue
        cur.append(i)
        count += lat.count
        if count >= need and span >= window_s - 1e-9:
            spans.append(cur)
            cur, count, span = [], 0, 0.0
    if cur:
        if spans:
            spans[-1].extend(cur)
        else:
            spans.append(cur)
    out = []
    for idx in spans:
        stats = [latencies[i] for i in idx]
        n = sum(s.count for s in stats)
        tail = pooled_percentile(stats, percentile)
        secs = sum(lengths[i] for i in range(idx[0], idx[-1] + 1))
        out.append(SloWindow(idx[0], idx[-1], len(idx), n, secs, not slo_met(tail, target_ms)))
    return out


def unfairness(slowdowns: Sequence[float]) -> float:
    """CoPart's unfairness over a run's batch jobs (:func:`models.objectives.unfairness`:
    population stddev / mean of the slowdowns, 0 = perfectly fair). A job that starved (an
    infinite slowdown) gives sqrt(n - 1) for n jobs: the limit as one slowdown grows
    without bound, and the largest value the ratio takes for n positive slowdowns. So the
    run is the least fair a run can be, and stays in a comparison: as infinity it dropped
    out of every mean and pair, and the controller that starved a job looked the fairer.
    NaN with fewer than two jobs: there is no fairness to judge, and such a run drops out
    of the paired unfairness comparison rather than count as a tie at 0."""
    if len(slowdowns) < 2:
        return math.nan
    value = objectives.unfairness(slowdowns)
    return math.sqrt(len(slowdowns) - 1) if math.isinf(value) else value


def summarize(
    records: Sequence[StepRecord],
    groups: Mapping[str, GroupSpec],
    reference_ips: Mapping[str, float],
) -> RunMetrics:
    """Reduce a run (from :func:`models.controller.drive`) to :class:`RunMetrics`."""
    if not records:
        raise ValueError("no intervals to summarise")
    violations = judged = 0
    tails: list[float] = []
    ips: dict[str, list[float]] = {}
    lat: dict[str, list[LatencyStats | None]] = {}
    for k, rec in enumerate(records):
        snap = rec.snapshot
        for name, sample in snap.groups.items():
            spec = groups.get(name)
            if spec is None:
                continue
            if spec.kind is GroupKind.LC and spec.slo is not None:
                series = lat.setdefault(name, [None] * k)
                series.append(sample.latency)
                if sample.latency and sample.latency.count:
                    tails.append(sample.latency.percentile(spec.slo.percentile))
            elif spec.kind is GroupKind.BATCH and sample.instructions is not None:
                ips.setdefault(name, []).append(sample.instructions / snap.interval_s)
        for series in lat.values():
            series.extend([None] * (k + 1 - len(series)))
    lengths = [r.snapshot.interval_s for r in records]
    window_s: list[float] = []
    for name, series in lat.items():
        slo = groups[name].slo
        for w in slo_windows(series, slo.percentile, slo.target_ms, lengths):
            judged += w.intervals
            violations += w.intervals if w.violated else 0
            window_s.append(w.seconds)
    mean_ips = {g: statistics.fmean(v) for g, v in ips.items() if g in reference_ips}
    slowdowns = [reference_ips[g] / v if v > 0 else math.inf for g, v in mean_ips.items()]
    # no batch job measured (none in the run, or none with a reference): no throughput to
    # judge, NaN rather than a speedup of 0 that would read as every job stopped
    speedup = sum(v / reference_ips[g] for g, v in mean_ips.items()) if mean_ips else math.nan
    changes = _changes(records)
    duration_min = sum(r.snapshot.interval_s for r in records) / 60.0
    return RunMetrics(
        slo_violation_rate=violations / judged if judged else 0.0,
        tail_latency_ms=statistics.fmean(tails) if tails else float("nan"),
        unfairness=unfairness(slowdowns),
        weighted_speedup=speedup,
        batch_ips=sum(mean_ips.values()) if mean_ips else math.nan,
        changes_per_minute=changes / duration_min if duration_min else 0.0,
        decide_us_median=statistics.median(_decide_times(records)) * 1e6,
        slo_window_s=statistics.fmean(window_s) if window_s else math.nan,
        slo_intervals_judged=float(judged),
    )


def _changes(records: Sequence[StepRecord]) -> int:
    """Intervals whose decision changed something: moved tasks, or a plan that left the
    node holding another allocation than the interval before. A controller that sends the
    plan it already holds every interval (a policy does) changes nothing by it. The first
    interval's plan counts: what was held before it is not recorded."""
    count = 0
    for k, rec in enumerate(records):
        d = rec.decision
        if d.moves or (
            d.plan is not None and (k == 0 or rec.allocation != records[k - 1].allocation)
        ):
            count += 1
    return count


def _decide_times(records: Sequence[StepRecord]) -> list[float]:
    """The seconds each decision took: the intervals a slower cadence skipped
    (models.cadence.decided) left out, unless it skipped every one."""
    return [r.decide_s for r in records if decided(r.decision)] or [r.decide_s for r in records]


def sim_reference_ips(node) -> dict[str, float]:
    """Each group's IPS with full resources alone, from a SimNode's ground truth."""
    from agent.sim.truth import solo_reference

    out: dict[str, float] = {}
    for w in node.workloads():
        if w.group:
            ips, _ = solo_reference(node.preset, w.spec, len(w.pids))
            out[w.group] = out.get(w.group, 0.0) + ips
    return out


def lc_tails(records: Sequence[StepRecord], groups: Mapping[str, GroupSpec]) -> dict[str, float]:
    """Per LC group, the mean over intervals (with requests) of its SLO-percentile latency."""
    tails: dict[str, list[float]] = {}
    for rec in records:
        for name, sample in rec.snapshot.groups.items():
            spec = groups.get(name)
            if spec is None or spec.kind is not GroupKind.LC or spec.slo is None:
                continue
            if sample.latency and sample.latency.count:
                tails.setdefault(name, []).append(sample.latency.percentile(spec.slo.percentile))
    return {g: statistics.fmean(v) for g, v in tails.items()}


def normalized_tail(tails: Mapping[str, float], alone: Mapping[str, float]) -> float:
    """Mean over LC groups of tail / tail alone (1 = as good as running alone; NaN when no
    group has a reference). Infinite when some group's tail is (a service the run
    overloaded, its queue growing without bound): left out, the service vanished from the
    mean, and the run that starved it looked better than one that kept it barely alive."""
    ratios = [t / alone[g] for g, t in tails.items() if alone.get(g, 0) > 0 and not math.isnan(t)]
    return statistics.fmean(ratios) if ratios else float("nan")


def sim_alone_tails(
    node, seconds: float = 5.0, interval_s: float | None = None
) -> dict[str, float]:
    """Each LC group's tail with its service alone on the machine (every way, full
    bandwidth, same load and seed), measured like a run: the mean over ``seconds`` of
    intervals of the SLO-percentile latency (a run's reference: its length, so that the
    loads are the run's). ``node`` is a SimNode; it is not disturbed. ``interval_s``: the
    measurement interval (default: the node's step), as in the run."""
    import dataclasses

    from agent.sim import SimNode

    out: dict[str, float] = {}
    scn = node.scenario
    interval = interval_s or node.interval_s
    seconds = max(seconds, 5 * interval)
    for view in node.workloads():
        if view.kind != "lc" or not view.group:
            continue
        inst = next(w for w in scn.workloads if w.name == view.name)
        alone_scn = dataclasses.replace(
            scn, name=f"{scn.name}-{view.name}-alone", workloads=(inst,)
        )
        alone = SimNode(alone_scn, seed=node.seed, interval_s=node.interval_s)
        try:
            specs = alone.groups()
            intervals = max(1, round(seconds / interval))
            alone.observe()
            records = []
            for _ in range(intervals):
                alone.advance(interval)
                records.append(alone.observe())
            vals = []
            for snap in records:
                for g, sample in snap.groups.items():
                    spec = specs.get(g)
                    if spec and spec.slo and sample.latency and sample.latency.count:
                        vals.append(sample.latency.percentile(spec.slo.percentile))
            if vals:
                out[view.group] = statistics.fmean(vals)
        finally:
            alone.close()
    return out

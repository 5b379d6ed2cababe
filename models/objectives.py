"""Objective functions shared by controllers, the oracle, environments and evaluation.

Pure functions over numbers (no nodes, no simulator), so envs/reward.py and evaluation can
reuse them as they are:

- :func:`slowdown` and :func:`unfairness` — CoPart, EuroSys'19 section 2 (equation 2, after
  its reference [37]): slowdown = IPS(full resources) / IPS(current allocation);
  unfairness = sigma / mu of the slowdowns (population standard deviation; lower is better).
- :func:`slo_violation` — relative excess of a tail latency over its SLO target
  (0 when met), the quantity catbench's and Ubik's SLO checks compare against.
- :class:`Outcome` bundles what one allocation produced (batch slowdowns, LC tail
  latencies and targets) and :data:`OBJECTIVES` scores it (lower is better):
  ``fairness`` (CoPart's), ``throughput`` (mean batch slowdown), ``fair_throughput``
  (batch unfairness, then mean slowdown) and ``slo_first`` (lexicographic: total SLO
  violation first, then batch unfairness, then mean slowdown, folded into one number with
  weights far apart).
- :class:`SloConstrained` turns an objective into a constrained one: every LC service
  within its SLO target shrunk by a safety margin, then the objective (the safe oracle's,
  BASELINES.md "Oracle"); :func:`slo_excess` measures how far an outcome is from that.
- SLO windows (:func:`window_requests`, :data:`SLO_WINDOW_S`): how many requests and how
  much time a measured percentile is judged on (eval/metrics.py judges runs so; the oracle
  sizes its safety margin to the noise of such a window, :func:`window_noise`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

# slo_first folds (violation, unfairness, mean slowdown) into one float. Unfairness is
# < ~2 and mean slowdown < ~1e2 for any allocation that runs, so these weights keep the
# order lexicographic while staying finite and comparable.
_VIOLATION_WEIGHT = 1e6
_UNFAIRNESS_WEIGHT = 1e2
# SloConstrained scores an outcome that misses a (margined) SLO at or above this, so any
# outcome that meets every SLO ranks first whatever the base objective says (objectives
# of allocations that run are far below it).
INFEASIBLE = 1e9

# An SLO window: consecutive intervals pooled until they span SLO_WINDOW_S seconds and hold
# MIN_TAIL_REQUESTS requests beyond the SLO percentile (1,000 for p95): a percentile is
# judged on enough requests and time to mean something, not on the 20 requests a slow
# service answers in 0.1 s, nor on one short burst of a busy one.
SLO_WINDOW_S = 1.0
MIN_TAIL_REQUESTS = 50


def window_requests(percentile: float) -> int:
    """Requests an SLO window holds at least: :data:`MIN_TAIL_REQUESTS` beyond
    ``percentile``."""
    if not 0.0 < percentile < 100.0:
        raise ValueError(f"percentile must be in (0, 100), got {percentile}")
    return math.ceil(round(MIN_TAIL_REQUESTS / (1.0 - percentile / 100.0), 6))


_KNOTS = (50.0, 95.0, 99.0, 99.9)  # the percentiles LatencyStats and the simulator report


def window_noise(
    latency_ms: Mapping[float, float],
    percentile: float,
    rate_rps: float,
    utilization: float,
    window_s: float = SLO_WINDOW_S,
) -> float:
    """Relative standard error of the ``percentile`` latency measured over one SLO window
    of a service whose steady-state percentiles are ``latency_ms`` (at least 50, 95, 99
    and 99.9), at ``rate_rps`` and per-worker ``utilization``.

    The sample quantile's standard error is sqrt(p (1 - p) / n) / f(x_p) (f: the latency
    density at the percentile, from the spacing to the next reported percentile; p99.9 uses
    the p99 - p99.9 spacing), with n the window's requests inflated by queueing's
    correlation between consecutive requests, (1 + rho) / (1 - rho) (an AR(1) sample's
    variance factor). Heavy tails (wide spacing), high utilisation and few requests per
    window all widen it; inf at utilisation 1 or with an unknown percentile.
    """
    p = percentile / 100.0
    above = [k for k in _KNOTS if k > percentile]
    hi = min(above) if above else _KNOTS[-1]
    lo = percentile if above else _KNOTS[-2]
    x, x_lo, x_hi = latency_ms.get(percentile), latency_ms.get(lo), latency_ms.get(hi)
    if x is None or x_lo is None or x_hi is None or not x > 0 or not utilization < 1.0:
        return math.inf
    if not (math.isfinite(x) and math.isfinite(x_hi) and math.isfinite(x_lo)):
        return math.inf
    inv_density = max(x_hi - x_lo, 0.0) / ((hi - lo) / 100.0)
    rho = max(utilization, 0.0)
    n = max(window_requests(percentile), rate_rps * window_s) * (1.0 - rho) / (1.0 + rho)
    return math.sqrt(p * (1.0 - p) / n) * inv_density / x


def slowdown(ips_full: float, ips_now: float) -> float:
    """IPS(full resources) / IPS(now); inf when the application made no progress."""
    if not (ips_full > 0 and math.isfinite(ips_full)):
        raise ValueError(f"IPS at full resources must be a positive number, got {ips_full}")
    if not ips_now > 0:
        return math.inf
    return ips_full / ips_now


def unfairness(slowdowns: Sequence[float]) -> float:
    """sigma / mu of the slowdowns (CoPart eq. 2); 0 for fewer than two applications."""
    xs = [float(x) for x in slowdowns]
    if len(xs) < 2:
        return 0.0
    if any(not math.isfinite(x) for x in xs):
        return math.inf
    mu = sum(xs) / len(xs)
    if mu <= 0:
        raise ValueError(f"slowdowns must be positive, got {xs}")
    var = sum((x - mu) ** 2 for x in xs) / len(xs)
    return math.sqrt(var) / mu


def mean_slowdown(slowdowns: Sequence[float]) -> float:
    """Arithmetic mean slowdown (1.0 for no applications)."""
    xs = [float(x) for x in slowdowns]
    return sum(xs) / len(xs) if xs else 1.0


def slo_violation(latency_ms: float, target_ms: float) -> float:
    """max(0, latency / target - 1): 0 when the SLO is met; inf when latency is unknown
    (NaN: no request completed) — an interval without answers is not a met SLO."""
    if not target_ms > 0:
        raise ValueError(f"SLO target must be positive, got {target_ms}")
    if math.isnan(latency_ms):
        return math.inf
    return max(0.0, latency_ms / target_ms - 1.0)


def slo_met(latency_ms: float, target_ms: float) -> bool:
    return slo_violation(latency_ms, target_ms) == 0.0


@dataclass(frozen=True)
class Outcome:
    """What one allocation produced, as plain numbers.

    Attributes:
        batch_slowdowns: one slowdown per batch application (or group).
        lc_latency_ms: each LC service's latency at its SLO percentile.
        lc_target_ms: the matching SLO targets.
    """

    batch_slowdowns: tuple[float, ...] = ()
    lc_latency_ms: tuple[float, ...] = ()
    lc_target_ms: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if len(self.lc_latency_ms) != len(self.lc_target_ms):
            raise ValueError("lc_latency_ms and lc_target_ms must have the same length")

    @property
    def violation(self) -> float:
        """Sum of the LC services' relative SLO excesses."""
        return sum(
            slo_violation(x, t) for x, t in zip(self.lc_latency_ms, self.lc_target_ms, strict=True)
        )

    @property
    def violations(self) -> int:
        """How many LC services miss their SLO."""
        return sum(
            not slo_met(x, t) for x, t in zip(self.lc_latency_ms, self.lc_target_ms, strict=True)
        )

    @property
    def unfairness(self) -> float:
        return unfairness(self.batch_slowdowns)

    @property
    def mean_slowdown(self) -> float:
        return mean_slowdown(self.batch_slowdowns)


def fairness_objective(o: Outcome) -> float:
    """CoPart's objective: batch unfairness (lower is better)."""
    return o.unfairness


def throughput_objective(o: Outcome) -> float:
    """Mean batch slowdown (lower is better: more batch throughput)."""
    return o.mean_slowdown


def fair_throughput_objective(o: Outcome) -> float:
    """Batch unfairness first, then mean batch slowdown (what slo_first ranks by once every
    SLO is met)."""
    return _UNFAIRNESS_WEIGHT * o.unfairness + o.mean_slowdown


def slo_excess(o: Outcome, margin: float = 0.0) -> float:
    """How far the LC services are from their SLOs shrunk by ``margin``: the sum of
    max(0, latency / ((1 - margin) x target) - 1); 0 when every one is within, inf when a
    latency is unknown (NaN) or unbounded."""
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    scale = 1.0 - margin
    return sum(
        slo_violation(x, t * scale) for x, t in zip(o.lc_latency_ms, o.lc_target_ms, strict=True)
    )


@dataclass(frozen=True)
class SloConstrained:
    """``base`` subject to every LC service meeting its SLO with ``margin`` (its latency at
    most (1 - margin) x target): outcomes that meet every SLO score ``base(o)``, the others
    ``INFEASIBLE x (1 + excess)`` (:func:`slo_excess`), so a search ranks feasibility first
    and, among infeasible outcomes, the ones closest to their SLOs."""

    base: Callable[[Outcome], float]
    margin: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"margin must be in [0, 1), got {self.margin}")

    def __call__(self, o: Outcome) -> float:
        excess = slo_excess(o, self.margin)
        if excess > 0.0:
            return INFEASIBLE * (1.0 + excess)
        return self.base(o)

    @staticmethod
    def feasible(score: float) -> bool:
        """Whether a score of this objective met every SLO with the margin."""
        return score < INFEASIBLE


def slo_first_objective(o: Outcome) -> float:
    """SLO violation first, then batch unfairness, then mean batch slowdown."""
    v = o.violation
    if math.isinf(v):
        return math.inf
    return _VIOLATION_WEIGHT * v + _UNFAIRNESS_WEIGHT * o.unfairness + o.mean_slowdown


Objective = Callable[[Outcome], float]

OBJECTIVES: dict[str, Objective] = {
    "fairness": fairness_objective,
    "throughput": throughput_objective,
    "fair_throughput": fair_throughput_objective,
    "slo_first": slo_first_objective,
}


def get_objective(name_or_fn: str | Objective | None, has_lc: bool) -> Objective:
    """An objective by name (see :data:`OBJECTIVES`) or as given; None picks the default:
    CoPart's fairness for batch-only mixes, SLO-first when LC services are present."""
    if name_or_fn is None:
        return slo_first_objective if has_lc else fairness_objective
    if callable(name_or_fn):
        return name_or_fn
    try:
        return OBJECTIVES[name_or_fn]
    except KeyError:
        raise ValueError(f"unknown objective {name_or_fn!r}; have {sorted(OBJECTIVES)}") from None

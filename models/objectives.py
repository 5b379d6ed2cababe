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
  ``fairness`` (CoPart's), ``throughput`` (mean batch slowdown) and ``slo_first``
  (lexicographic: total SLO violation first, then batch unfairness, then mean slowdown, folded
  into one number with weights far apart).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# slo_first folds (violation, unfairness, mean slowdown) into one float. Unfairness is
# < ~2 and mean slowdown < ~1e2 for any allocation that runs, so these weights keep the
# order lexicographic while staying finite and comparable.
_VIOLATION_WEIGHT = 1e6
_UNFAIRNESS_WEIGHT = 1e2


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

"""The SLO-met rule, written once: when an LC service's tail latency meets its SLO, and what
an interval without answers means.

- :func:`slo_met`: the tail latency at the SLO's percentile is at most the target. A tail
  that is not a number (NaN: a percentile that could not be computed) or infinite (requests
  that never finished) does **not** meet it: unknown is not met.
- :func:`judged`: an interval (or a window of them) is judged only when requests completed
  in it. An idle service neither meets nor misses its SLO; its interval is left out of
  rates, guards and rewards rather than counted either way.
- :func:`slo_verdict`: both together, for latency statistics and an SLO: None when not
  judged, else :func:`slo_met`.

The agent's SLO metrics (agent/server/metrics.py), the tuner's SLO guard (tuner/guard.py),
evaluation's SLO windows (eval/metrics.py), the environment's reward (envs/reward.py) and
the controllers' objectives (models/objectives.py) all judge with these functions.
"""

from __future__ import annotations

import math

from agent.types import SLO, LatencyStats


def slo_met(tail_ms: float, target_ms: float) -> bool:
    """Whether a tail latency meets a target: ``tail_ms <= target_ms``; NaN and infinity
    never do."""
    return math.isfinite(tail_ms) and tail_ms <= target_ms


def judged(latency: LatencyStats | None) -> bool:
    """Whether an interval's latency statistics say anything about the SLO (requests
    completed in it)."""
    return latency is not None and latency.count > 0


def slo_verdict(latency: LatencyStats | None, slo: SLO) -> bool | None:
    """True when the interval met ``slo``, False when it missed it, None when there is
    nothing to judge (no statistics, or no request completed)."""
    if not judged(latency):
        return None
    return slo_met(latency.percentile(slo.percentile), slo.target_ms)

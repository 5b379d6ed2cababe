"""LC request queues simulated request by request: the reference the latency tables are built from.

Each LC service has ``k`` workers; requests are dispatched to workers uniformly at random,
so each worker is a FIFO queue with its share of the arrivals. Arrivals come in *bursts*
(a compound Poisson process: bursts arrive as a Poisson process, each brings a geometric
number of requests with mean ``burst``, all at once); ``burst = 1`` is a Poisson process.
Bursts are how real request streams look at sub-millisecond scale (clients pipeline and
fan out; load balancers batch), and they make the tail grow faster with load than an
M/G/1 queue's (docs/SIMULATOR.md, "LC services").

Waits follow the Lindley recursion ``W[n+1] = max(0, W[n] + S[n] - A[n+1])``, computed
as a cumulative sum minus its running minimum (no per-request Python loop). This module is
not on the simulator's step path: :mod:`agent.sim.latency` turns long runs of it into
tables of latency quantiles against utilisation, and the tests check the tables against it.
"""

from __future__ import annotations

import numpy as np

from agent.sim.catalog import ServiceDist


def service_multipliers(rng: np.random.Generator, dist: ServiceDist, shape) -> np.ndarray:
    """Service-time multipliers with mean 1 in the workload's distribution."""
    s = dist.sigma
    jitter = rng.standard_normal(shape)
    jitter *= s
    jitter -= 0.5 * s * s
    np.exp(jitter, out=jitter)  # lognormal with mean 1
    if dist.kind in ("constant", "lognormal"):
        return jitter
    probs = np.array([p for p, _ in dist.modes])
    vals = np.array([v for _, v in dist.modes])
    probs = probs / probs.sum()
    vals = vals / float(probs @ vals)
    idx = np.searchsorted(np.cumsum(probs)[:-1], rng.random(shape), side="right")
    return vals[idx] * jitter


def burst_arrivals(rng: np.random.Generator, n: int, burst: float) -> np.ndarray:
    """Gaps before each of ``n`` requests of one worker, for a unit mean inter-arrival time.

    Burst starts are a Poisson process with mean gap ``burst``; burst sizes are geometric
    with mean ``burst``; requests within a burst arrive together (gap 0).
    """
    if burst <= 1.0:
        return rng.standard_exponential(n)
    first = rng.random(n) < 1.0 / burst  # a request starts a new burst with this probability
    first[0] = True
    gaps = np.zeros(n)
    gaps[first] = rng.standard_exponential(int(first.sum())) * burst
    return gaps


def lindley(gaps: np.ndarray, service: np.ndarray, backlog: float = 0.0) -> np.ndarray:
    """Latencies (wait + service) of FIFO requests with inter-arrival ``gaps`` (the first
    gap is from the start, where ``backlog`` work is queued) and service times ``service``.

    Works along the last axis, so several independent queues go in one call.
    """
    y = np.empty_like(service)
    y[..., 0] = backlog - gaps[..., 0]
    np.subtract(service[..., :-1], gaps[..., 1:], out=y[..., 1:])
    cum = np.cumsum(y, axis=-1)
    low = np.minimum.accumulate(cum, axis=-1)
    np.minimum(low, 0.0, out=low)
    cum -= low
    cum += service
    return cum


def steady_samples(
    utilisation: float,
    dist: ServiceDist,
    burst: float = 1.0,
    requests: int = 200_000,
    seed: int = 12345,
) -> np.ndarray:
    """Latencies, in units of the mean service time, of one worker at ``utilisation``
    (< 1): a long fixed-seed run after a warm-up of a tenth of it."""
    if not 0.0 <= utilisation < 1.0:
        raise ValueError(f"no steady state at utilisation {utilisation} (need 0 <= u < 1)")
    rng = np.random.default_rng(seed)
    warm = max(requests // 10, 100)
    total = warm + requests
    service = service_multipliers(rng, dist, total)
    if utilisation == 0.0:
        return service[warm:]
    gaps = burst_arrivals(rng, total, burst) / utilisation
    return lindley(gaps, service)[warm:]


def tail_mean(latencies: np.ndarray, percentile: float = 95.0) -> float:
    """Mean latency of the requests beyond ``percentile`` (Ubik's tail metric, Sec. 3.2)."""
    cut = np.percentile(latencies, percentile)
    return float(latencies[latencies >= cut].mean())

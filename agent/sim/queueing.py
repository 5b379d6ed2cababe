"""LC services as request queues (SIMULATOR.md item 6), without per-request Python loops.

Each service has ``k`` workers; requests are dispatched to workers uniformly at random
(each worker is a FIFO M/G/1 queue with rate lambda/k, as with memcached's per-thread
connections). Waits follow the Lindley recursion ``W[n+1] = max(0, W[n] + S[n] - A[n+1])``,
computed per worker with a cumulative sum and a running minimum. The unfinished work of
each worker is carried over interval boundaries. When an interval would hold more than
``max_requests`` requests, a window at the interval's start with the true arrival rate is
simulated (counts are scaled to the whole interval) and the backlog is advanced over the
rest of the interval by its mean drift (grows when overloaded, drains otherwise).
"""

from __future__ import annotations

import math

import numpy as np

from agent.sim.catalog import ServiceDist

_EMPTY = np.empty(0)
BACKLOG_CAP_S = 30.0  # clients time out: a queue never holds more than this much work


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


def simulate(
    rng: np.random.Generator,
    rate: float,
    mean_service_s: float,
    dist: ServiceDist,
    backlog: np.ndarray,
    dt: float,
    max_requests: int,
) -> tuple[np.ndarray, int, np.ndarray]:
    """Simulate ``dt`` seconds of a k-worker service.

    The number of arrivals in the (possibly sampled) window is Poisson; given it, each
    worker's arrival times are uniform order statistics over the window (exponential gaps
    normalised by their sum: exactly a Poisson process conditioned on its count).

    Args:
        backlog: unfinished work (s) per worker at the start; its length is k.

    Returns:
        (latencies in seconds of the simulated requests, the number of requests the
        whole interval received (scaled when sampled), backlog at the end).
    """
    k = backlog.shape[0]
    if rate <= 0 or not math.isfinite(mean_service_s):
        return _EMPTY, 0, np.maximum(backlog - dt, 0.0)
    expected = rate * dt
    window = dt if expected <= max_requests else dt * max_requests / expected
    total = int(rng.poisson(rate * window))
    if total == 0:
        new_backlog = np.maximum(backlog - dt, 0.0)
        return _EMPTY, 0, new_backlog
    n = -(-total // k)  # requests per worker (k * n >= total; the extra few are simulated)
    e = rng.standard_exponential((k, n + 1))
    c = np.cumsum(e, axis=1)
    scale = window / c[:, n:]
    arrivals = c[:, :n] * scale
    gaps = e[:, :n] * scale
    service = service_multipliers(rng, dist, (k, n))
    service *= mean_service_s
    # Lindley: Y1 = B - t1, Y_{i+1} = S_i - gap_{i+1}; W_i = C_i - min(0, min_{j<=i} C_j).
    y = np.empty((k, n))
    np.subtract(backlog, arrivals[:, 0], out=y[:, 0])
    np.subtract(service[:, :-1], gaps[:, 1:], out=y[:, 1:])
    cum = np.cumsum(y, axis=1)
    low = np.minimum.accumulate(cum, axis=1)
    np.minimum(low, 0.0, out=low)
    cum -= low
    cum += service  # latency = wait + service
    # Backlog at the window's end: the last request's remaining work (FIFO: it ends last).
    new_backlog = arrivals[:, -1] + cum[:, -1]
    new_backlog -= window
    np.maximum(new_backlog, 0.0, out=new_backlog)
    count = total
    if window < dt:
        rho = rate / k * mean_service_s
        new_backlog += (rho - 1.0) * (dt - window)
        np.maximum(new_backlog, 0.0, out=new_backlog)
        count = round(total * dt / window)
    np.minimum(new_backlog, BACKLOG_CAP_S, out=new_backlog)
    return cum.ravel(), count, new_backlog


def steady_samples(
    rate: float,
    mean_service_s: float,
    dist: ServiceDist,
    workers: int,
    requests: int = 200_000,
    seed: int = 12345,
) -> np.ndarray:
    """Latencies (s) of a long fixed-seed steady-state run (after a warm-up from empty).

    Requires utilisation < 1 (a stationary queue).
    """
    if rate * mean_service_s / workers >= 1.0:
        raise ValueError("no steady state at utilisation >= 1")
    rng = np.random.default_rng(seed)
    backlog = np.zeros(workers)
    warm = max(requests // 10, 100)
    _, _, backlog = simulate(rng, rate, mean_service_s, dist, backlog, warm / rate, warm + 1)
    lat, _, _ = simulate(rng, rate, mean_service_s, dist, backlog, requests / rate, requests + 1)
    return lat


def tail_mean(latencies: np.ndarray, percentile: float = 95.0) -> float:
    """Mean latency of the requests beyond ``percentile`` (Ubik's tail metric, Sec. 3.2)."""
    cut = np.percentile(latencies, percentile)
    return float(latencies[latencies >= cut].mean())


def steady_latency(
    rate: float,
    mean_service_s: float,
    dist: ServiceDist,
    workers: int,
    percentiles=(50.0, 95.0, 99.0, 99.9),
    requests: int = 200_000,
    seed: int = 12345,
) -> tuple[float, ...]:
    """Noise-free steady-state latency percentiles (s): a long fixed-seed run.

    ``inf`` when the offered load reaches the capacity (utilisation >= 1).
    """
    if rate <= 0:
        return tuple(float(mean_service_s) for _ in percentiles)
    if rate * mean_service_s / workers >= 1.0:
        return tuple(float("inf") for _ in percentiles)
    lat = steady_samples(rate, mean_service_s, dist, workers, requests, seed)
    return tuple(float(x) for x in np.percentile(lat, percentiles))

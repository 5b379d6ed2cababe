"""LC latency without simulating requests: quantile tables against utilisation.

A worker of an LC service is a FIFO queue fed by bursty arrivals (:mod:`agent.sim.queueing`).
In units of the mean service time ``S``, its stationary latency distribution depends only on
the utilisation ``rho`` and on the service's *shape* (service-time distribution and mean burst
size). So each shape gets a table ``Q[rho, p]`` of latency quantiles (and Ubik's tail mean)
built once from a long reference simulation with common random numbers across ``rho``
(smooth and monotone in ``rho``), and a step of the simulator reads

    latency quantile p = backlog + S * Q(rho, p)

where ``backlog`` is the fluid backlog an overloaded service accumulates (it grows at
``rho - 1`` per second of time and drains at ``1 - rho``; docs/SIMULATOR.md, "LC services").
Between grid points the table is interpolated linearly in ``rho`` on log-quantiles; above
:data:`RHO_TABLE` the waiting part is extrapolated as ``1/(1 - rho)`` (heavy-traffic
scaling) up to :data:`RHO_CAP`, beyond which the fluid backlog carries the overload.

An interval observed by a controller pools several steps (and a group several services):
:func:`pooled_quantiles` inverts the mixture of their distributions. What a controller sees
is an empirical quantile of the interval's requests, so :func:`observed` adds the sampling
error of an order statistic of ``n`` requests.

Tables for the catalog's shapes ship in ``data/latency_tables.npz`` (regenerate with
``python -m agent.sim.latency --write`` after changing a service shape); a shape not in the
file is built on first use (about a second) and kept for the process.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.sim.catalog import DATA_DIR, ServiceDist
from agent.sim.queueing import burst_arrivals, lindley, service_multipliers

TABLES_FILE = DATA_DIR / "latency_tables.npz"
STANDARD = (50.0, 95.0, 99.0, 99.9)
RHO_TABLE = 0.98  # highest utilisation simulated for the tables
RHO_CAP = 0.995  # above this the stationary part stops growing (the backlog takes over)
# Utilisations of the table: dense near 1, where latency moves fastest.
RHO_GRID = np.unique(np.concatenate([np.linspace(0.0, 0.8, 33), np.linspace(0.8, RHO_TABLE, 19)]))
# Probabilities of the table: evenly spaced in -log10(1 - p) up to p = 0.9999, with the
# standard percentiles exactly on the grid.
P_GRID = np.unique(
    np.concatenate([1.0 - 10.0 ** -np.arange(0.05, 4.0001, 0.05), np.array(STANDARD) / 100.0])
)
_STD_IDX = np.searchsorted(P_GRID, np.array(STANDARD) / 100.0)
BUILD_REQUESTS = 400_000  # a shape built at first use (about a second)
SHIPPED_REQUESTS = 2_000_000  # the shipped tables: sampling error near 2% at rho = 0.8


def shape_key(dist: ServiceDist, burst: float) -> str:
    """A stable name for a service shape (distribution + burst size)."""
    text = f"{dist.kind}|{dist.sigma!r}|{tuple(dist.modes)!r}|{float(burst)!r}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class LatencyTable:
    """Latency of one worker in units of the mean service time, against utilisation.

    Attributes:
        q: (len(RHO_GRID), len(P_GRID)) latency quantiles.
        tail95: (len(RHO_GRID),) mean latency beyond the 95th percentile (Ubik's metric).
    """

    q: np.ndarray
    tail95: np.ndarray

    def __post_init__(self) -> None:
        # A service at a steady operating point asks for the same utilisation every step.
        object.__setattr__(self, "_memo", {})
        # Interpolation runs on log-quantiles: take the logs once.
        object.__setattr__(self, "_logs", {id(self.q): np.log(self.q)})

    def _at(self, values: np.ndarray, rho: np.ndarray) -> np.ndarray:
        """``values`` (rows over RHO_GRID) at utilisations ``rho`` (any shape) -> (..., cols)."""
        rho = np.asarray(rho, dtype=float)
        r = np.clip(rho, 0.0, RHO_TABLE)
        i = np.clip(np.searchsorted(RHO_GRID, r, side="right") - 1, 0, len(RHO_GRID) - 2)
        w = (r - RHO_GRID[i]) / (RHO_GRID[i + 1] - RHO_GRID[i])
        lv = self._logs.get(id(values))
        if lv is None:
            lv = np.log(values)
        out = np.exp(lv[i] * (1.0 - w)[..., None] + lv[i + 1] * w[..., None])
        hi = rho > RHO_TABLE
        if np.any(hi):
            # Heavy traffic: the waiting part grows as 1 / (1 - rho).
            base = values[0]
            scale = (1.0 - RHO_TABLE) / (1.0 - np.minimum(rho, RHO_CAP))
            grown = base + (out - base) * scale[..., None]
            out = np.where(hi[..., None], grown, out)
        return out

    def quantiles(self, rho) -> np.ndarray:
        """The whole quantile function (..., len(P_GRID)) at utilisations ``rho``."""
        if isinstance(rho, float):
            memo = self._memo
            out = memo.get(rho)
            if out is None:
                if len(memo) > 256:
                    memo.clear()
                out = memo[rho] = self._at(self.q, rho)
            return out
        return self._at(self.q, rho)

    def standard(self, rho) -> np.ndarray:
        """p50, p95, p99, p99.9 (..., 4) at utilisations ``rho``."""
        return self._at(self.q, rho)[..., _STD_IDX]

    def tail_mean(self, rho) -> np.ndarray:
        return self._at(self.tail95[:, None], rho)[..., 0]


def build_table(
    dist: ServiceDist, burst: float, requests: int = BUILD_REQUESTS, seed: int = 2024
) -> LatencyTable:
    """Simulate one worker at every utilisation of RHO_GRID (common random numbers)."""
    rng = np.random.default_rng(seed)
    warm = requests // 10
    total = warm + requests
    service = service_multipliers(rng, dist, total)
    unit_gaps = burst_arrivals(rng, total, burst)
    q = np.empty((len(RHO_GRID), len(P_GRID)))
    tail = np.empty(len(RHO_GRID))
    for i, rho in enumerate(RHO_GRID):
        lat = service[warm:] if rho == 0.0 else lindley(unit_gaps / rho, service)[warm:]
        lat = np.sort(lat)
        q[i] = np.quantile(lat, P_GRID, method="linear")
        cut = int(np.searchsorted(lat, q[i, _STD_IDX[1]]))
        tail[i] = lat[cut:].mean()
    # Sampling noise must not make a quantile fall with load.
    q = np.maximum.accumulate(q, axis=0)
    tail = np.maximum.accumulate(tail)
    return LatencyTable(q, tail)


_cache: dict[str, LatencyTable] = {}
_lock = threading.Lock()
_shipped: dict[str, LatencyTable] | None = None


def _load_shipped() -> dict[str, LatencyTable]:
    global _shipped
    if _shipped is None:
        out: dict[str, LatencyTable] = {}
        if TABLES_FILE.is_file():
            with np.load(TABLES_FILE, allow_pickle=False) as data:
                grid_ok = np.array_equal(data["rho_grid"], RHO_GRID) and np.array_equal(
                    data["p_grid"], P_GRID
                )
                if grid_ok:
                    for k in data.files:
                        if k.endswith(".q"):
                            key = k[:-2]
                            out[key] = LatencyTable(data[k], data[f"{key}.tail95"])
        _shipped = out
    return _shipped


def table_for(dist: ServiceDist, burst: float) -> LatencyTable:
    """The table of a service shape: shipped, cached, or built now."""
    key = shape_key(dist, burst)
    table = _cache.get(key)
    if table is None:
        with _lock:
            table = _cache.get(key) or _load_shipped().get(key)
            if table is None:
                table = build_table(dist, burst)
            _cache[key] = table
    return table


def write_tables(shapes: dict[str, tuple[ServiceDist, float]], path: Path = TABLES_FILE) -> None:
    arrays: dict[str, np.ndarray] = {"rho_grid": RHO_GRID, "p_grid": P_GRID}
    for key, (dist, burst) in sorted(shapes.items()):
        t = build_table(dist, burst, requests=SHIPPED_REQUESTS)
        arrays[f"{key}.q"] = t.q
        arrays[f"{key}.tail95"] = t.tail95
    np.savez_compressed(path, **arrays)


def catalog_shapes(catalog=None) -> dict[str, tuple[ServiceDist, float]]:
    """Every LC service shape of a catalog (default: the shipped one)."""
    from agent.sim.catalog import default_catalog

    catalog = catalog or default_catalog()
    out = {}
    for spec in catalog.workloads.values():
        if spec.lc is not None:
            out[shape_key(spec.lc.service, spec.lc.burst)] = (spec.lc.service, spec.lc.burst)
    return out


# --------------------------------------------------------------------------- per interval


def fluid_backlog(backlog: float, rho: float, dt: float) -> tuple[float, float]:
    """(backlog at the end of ``dt``, its mean over ``dt``): grows at ``rho - 1`` (work
    seconds per second) while overloaded, drains at ``1 - rho`` otherwise, never below 0."""
    end = backlog + (rho - 1.0) * dt
    if end >= 0.0:
        return end, 0.5 * (backlog + end)
    # Drained within the step: the mean counts the part before it hit 0.
    t0 = backlog / (1.0 - rho)
    return 0.0, 0.5 * backlog * t0 / dt


def pooled_quantiles(
    weights: np.ndarray,
    shifts: np.ndarray,
    scales: np.ndarray,
    qfuncs: np.ndarray,
    probs: np.ndarray,
) -> np.ndarray:
    """Quantiles ``probs`` of a mixture of latency distributions.

    Component c has weight ``weights[c]`` and latency ``shifts[c] + scales[c] * X_c`` where
    X_c's quantile function on P_GRID is ``qfuncs[c]``. Each component's CDF is evaluated
    on the union of all components' quantile points; the mixture's CDF there is inverted.
    """
    if len(weights) == 1:
        return shifts[0] + scales[0] * np.interp(probs, P_GRID, qfuncs[0])
    pts = (shifts[:, None] + scales[:, None] * qfuncs).ravel()
    pts.sort()
    w = weights / weights.sum()
    cdf = np.zeros_like(pts)
    for c in range(len(w)):
        x = (pts - shifts[c]) / scales[c]
        cdf += w[c] * np.interp(x, qfuncs[c], P_GRID, left=0.0, right=1.0)
    return np.interp(probs, cdf, pts)


_DELTA = 0.004  # probability step for the density at a quantile (sampling error below)


def observed(
    rng: np.random.Generator | None,
    count: int,
    weights: np.ndarray,
    shifts: np.ndarray,
    scales: np.ndarray,
    qfuncs: np.ndarray,
) -> np.ndarray:
    """p50/p95/p99/p99.9 (seconds) a monitor would report from ``count`` requests drawn
    from the pooled distribution: the true quantiles plus an order statistic's sampling
    error (standard deviation ``sqrt(p (1 - p) / n) / f(x_p)``), sorted so they stay
    monotone. ``rng=None`` gives the true quantiles."""
    probs = np.array(STANDARD) / 100.0
    if rng is None or count <= 0:
        return pooled_quantiles(weights, shifts, scales, qfuncs, probs)
    lo = np.maximum(probs - _DELTA, P_GRID[0])
    hi = np.minimum(probs + _DELTA, P_GRID[-1])
    both = pooled_quantiles(weights, shifts, scales, qfuncs, np.concatenate([probs, lo, hi]))
    x, xlo, xhi = both[:4], both[4:8], both[8:]
    slope = (xhi - xlo) / (hi - lo)  # dx/dp = 1 / density
    sd = np.sqrt(probs * (1.0 - probs) / count) * slope
    # One sample gives all four: their errors are correlated.
    z = 0.8 * rng.standard_normal() + 0.6 * rng.standard_normal(4)
    return np.sort(np.maximum(x + sd * z, 0.0))


if __name__ == "__main__" and "--write" in sys.argv:
    shapes = catalog_shapes()
    write_tables(shapes)
    print(f"wrote {len(shapes)} tables to {TABLES_FILE}")

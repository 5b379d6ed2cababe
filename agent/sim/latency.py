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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.compiled import COMPILING
from agent.sim import latency_kernel
from agent.sim.catalog import DATA_DIR, ServiceDist
from agent.sim.queueing import burst_arrivals, lindley, service_multipliers
from agent.sim.streams import Streams, normals

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
        # minimum/maximum rather than clip: the same values, a third of the call's cost.
        r = np.minimum(np.maximum(rho, 0.0), RHO_TABLE)
        i = np.searchsorted(RHO_GRID, r, side="right") - 1
        i = np.minimum(np.maximum(i, 0), len(RHO_GRID) - 2)
        w = (r - RHO_GRID[i]) / (RHO_GRID[i + 1] - RHO_GRID[i])
        lv = self._logs.get(id(values))
        if lv is None:
            lv = np.log(values)
        out = np.exp(lv[i] * (1.0 - w)[..., None] + lv[i + 1] * w[..., None])
        hi = rho > RHO_TABLE
        if np.count_nonzero(hi):
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


class TableStack:
    """Several :class:`LatencyTable` s read as one: the quantile functions of records that
    each name their table, in one compiled pass (a batch of nodes holds services of a
    dozen shapes; one lookup per shape costs more in numpy's per-call overhead than in
    arithmetic). The numbers are :meth:`LatencyTable.quantiles`' bit for bit
    (tests/agent/sim/test_latency.py).

    Args:
        tables: the tables, in the order records name them.
    """

    def __init__(self, tables: Sequence[LatencyTable]) -> None:
        self.tables = tuple(tables)
        self._logs = np.stack([np.log(t.q) for t in self.tables])
        self._base = np.stack([t.q[0] for t in self.tables])

    def quantiles(self, which: np.ndarray, rho: np.ndarray) -> np.ndarray:
        """(R, len(P_GRID)): record ``r``'s whole quantile function on table ``which[r]`` at
        utilisation ``rho[r]``."""
        which = np.ascontiguousarray(which, dtype=np.int64)
        rho = np.ascontiguousarray(rho, dtype=float)
        out = np.empty((len(rho), self._logs.shape[2]))
        heavy = latency_kernel.log_quantiles(self._logs, RHO_GRID, RHO_TABLE, which, rho, out)
        np.exp(out, out=out)  # numpy's exp, as LatencyTable's
        if heavy:
            latency_kernel.heavy_traffic(self._base, RHO_TABLE, RHO_CAP, which, rho, out)
        return out


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


def fluid_backlog(backlog, rho, dt: float):
    """(backlog at the end of ``dt``, its mean over ``dt``): grows at ``rho - 1`` (work
    seconds per second) while overloaded, drains at ``1 - rho`` otherwise, never below 0.
    Floats or arrays (one entry per service)."""
    backlog = np.asarray(backlog, dtype=float)
    rho = np.asarray(rho, dtype=float)
    end = backlog + (rho - 1.0) * dt
    full = end >= 0.0
    # Drained within the step: the mean counts the part before it hit 0.
    t0 = backlog / np.where(full, 1.0, 1.0 - rho)
    mean = np.where(full, 0.5 * (backlog + end), 0.5 * backlog * t0 / dt)
    if end.ndim == 0:
        return float(end) if full else 0.0, float(mean)
    return np.where(full, end, 0.0), mean


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
    One mixture of :func:`pooled_quantiles_many`.
    """
    n = np.array([len(weights)])
    return pooled_quantiles_many(n, weights, shifts, scales, qfuncs, probs)[0]


def pooled_quantiles_many(
    parts: np.ndarray,
    weights: np.ndarray,
    shifts: np.ndarray,
    scales: np.ndarray,
    qfuncs: np.ndarray,
    probs: np.ndarray,
) -> np.ndarray:
    """:func:`pooled_quantiles` of many mixtures at once -> (mixtures, len(probs)).

    Mixture ``g`` has ``parts[g]`` components (at least one); ``weights``, ``shifts``,
    ``scales`` (T,) and ``qfuncs`` (T, len(P_GRID)) list the components of mixture 0, then
    those of mixture 1, and so on (T = ``parts.sum()``). Mixtures with the same number of
    components are computed together.
    """
    parts = np.asarray(parts, dtype=np.int64)
    probs = np.asarray(probs, dtype=float)
    if len(shifts) == len(parts):  # one component each (an interval of one step)
        return shifts[:, None] + scales[:, None] * _interp_shared(probs, P_GRID, qfuncs)
    out = np.empty((len(parts), len(probs)))
    first = np.concatenate([[0], np.cumsum(parts)[:-1]])
    for c in np.unique(parts):
        rows = np.flatnonzero(parts == c)
        idx = first[rows][:, None] + np.arange(c)  # (R, c)
        s, a, q = shifts[idx], scales[idx], qfuncs[idx]
        if c == 1:
            out[rows] = s + a * _interp_shared(probs, P_GRID, q[:, 0])
        else:
            out[rows] = _mixture(weights[idx], s, a, q, probs)
    return out


def with_stalls(
    parts: np.ndarray,
    weights: np.ndarray,
    shifts: np.ndarray,
    scales: np.ndarray,
    qfuncs: np.ndarray,
    share: np.ndarray,
    stall_s: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """Components (listed as :func:`pooled_quantiles_many` takes them) with worker stalls:
    a share ``share[c]`` of component ``c``'s requests arrives while its worker is stalled
    for ``stall_s[c]`` and waits out the rest of the stall (uniform on [0, stall]) on top
    of its queueing, approximated by the queue's mean (a stall lasts milliseconds, a
    queue's spread microseconds). Such components split in two: the stall-free requests
    and a uniform component after them, so ``parts`` grows by one per stalled component
    (docs/SIMULATOR.md, "LC services")."""
    stalled = (share > 0) & (stall_s > 0)
    if not stalled.any():
        return parts, weights, shifts, scales, qfuncs
    k = np.flatnonzero(stalled)
    q = np.minimum(share[k], 1.0)
    # The mean of the unit-mean-service latency X from its quantile function.
    mean = qfuncs[k] @ _MEAN_W
    # Contiguous arrays: one compiled signature whatever views the caller passes.
    comp = [np.ascontiguousarray(x, dtype=float) for x in (weights, shifts, scales, qfuncs)]
    args = (*comp, k, q, mean, np.ascontiguousarray(stall_s, dtype=float), P_GRID)
    return latency_kernel.split_stalled(np.ascontiguousarray(parts, dtype=np.int64), *args)


def _interp_shared(x: np.ndarray, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """``np.interp(x, xp, fp[r])`` for every row ``r`` of ``fp`` (the same formula)."""
    j, j1, gap, dx, at, above, below = _shared_points(x, xp)
    lo, hi = fp[:, j], fp[:, j1]
    out = (hi - lo) / gap * dx + lo
    if at is not None:
        out = np.where(at, lo, out)
    if above is not None:
        out = np.where(above, fp[:, -1:], out)
    return out if below is None else np.where(below, fp[:, :1], out)


_POINTS: dict[int, tuple] = {}  # id(x) -> (x, its points) for the module's probabilities


def _shared_points(x: np.ndarray, xp: np.ndarray) -> tuple:
    """What :func:`_interp_shared` needs of ``x`` and ``xp`` alone: the interval of each
    point, its width and offset, and which points sit on a knot or beyond the ends (None
    where none does). Kept for the observation's fixed probability arrays on P_GRID."""
    got = _POINTS.get(id(x)) if xp is P_GRID else None
    if got is not None and got[0] is x:
        return got[1]
    j = np.clip(np.searchsorted(xp, x, side="right") - 1, 0, len(xp) - 2)
    at, above, below = x == xp[j], x >= xp[-1], x < xp[0]
    parts = (
        j,
        j + 1,
        xp[j + 1] - xp[j],
        x - xp[j],
        *(m if m.any() else None for m in (at, above, below)),
    )
    if xp is P_GRID and any(x is c for c in _KEPT):
        _POINTS[id(x)] = (x, parts)
    return parts


def _mixture(
    w: np.ndarray, s: np.ndarray, a: np.ndarray, q: np.ndarray, probs: np.ndarray
) -> np.ndarray:
    """:func:`_mixture_arrays`, compiled where numba is (agent/sim/latency_kernel.py: the
    same numbers, a few times faster; without numba, the array code is the faster)."""
    if not COMPILING or q.shape[1] > latency_kernel.MAX_PARTS:
        return _mixture_arrays(w, s, a, q, probs)
    arrays = (np.ascontiguousarray(x, dtype=float) for x in (w, s, a, q, probs))
    return latency_kernel.mixture(*arrays, _DP, float(P_GRID[0]), float(P_GRID[-1]))


def _mixture_arrays(
    w: np.ndarray, s: np.ndarray, a: np.ndarray, q: np.ndarray, probs: np.ndarray
) -> np.ndarray:
    """Quantiles of R mixtures of c components each (arrays (R, c) and q (R, c, K)).

    Every component's CDF is piecewise linear between its quantile points (0 below the
    first, 1 beyond the last, as ``np.interp(..., left=0, right=1)``), so the mixture's CDF
    is linear between consecutive points of the union. Walking the union in order, each
    point changes one component's slope (or adds a step), so the mixture's slope is a
    running sum and its CDF a running sum of slope x gap: O(c K) per mixture where
    evaluating every component at every union point is O(c^2 K).
    """
    R, c, K = q.shape
    n = c * K
    knots = s[:, :, None] + a[:, :, None] * q  # the union points, as pooled_quantiles has them
    x0 = knots.min(axis=(1, 2))
    rel = knots - x0[:, None, None]  # >= 0, and a local origin keeps the running sums small
    w = w / w.sum(axis=1, keepdims=True)
    wk = w[..., None]
    width = rel[..., 1:] - rel[..., :-1]
    # A piece far narrower than its component (tied table entries) is a step: its slope
    # would be rounding noise times a huge number.
    steep = width > 1e-9 * (rel[..., -1:] - rel[..., :1] + a[..., None])
    slope = np.where(steep, _DP / np.where(steep, width, 1.0), 0.0)
    # Per point: the slope it starts minus the one it ends, and the step it adds. The CDF
    # is taken right after each point (its steps in): the inversion below interpolates
    # linearly between points, which is exact for the mixture's piecewise-linear CDF only
    # from there. (np.interp at a component's own first or last point, recomputed from the
    # shifted point, lands on either side of it by a rounding: counting its step or not
    # there moved the quantiles up to the next point, ~1% of a tail, on a last-bit change.)
    d_slope = np.zeros((R, c, K))
    d_slope[..., :-1] = slope
    d_slope[..., 1:] -= slope
    d_slope *= wk
    step = np.empty((R, c, K))
    step[..., 0] = P_GRID[0]
    step[..., 1:] = np.where(steep, 0.0, _DP)
    step[..., -1] += 1.0 - P_GRID[-1]  # beyond the last point: 1
    step *= wk
    # Sort the union: the point's index in the low bits of its (non-negative) value's bits.
    flat = rel.reshape(R, n)
    low = (1 << max(1, (n - 1).bit_length())) - 1
    keys = (flat.view(np.int64) & ~low) | np.arange(n)
    keys.sort(axis=1)
    at = ((keys & low) + np.arange(0, R * n, n)[:, None]).ravel()
    pos = flat.ravel()[at].reshape(R, n)
    slopes = np.cumsum(d_slope.ravel()[at].reshape(R, n), axis=1)
    lin = np.zeros((R, n))
    np.cumsum(slopes[:, :-1] * (pos[:, 1:] - pos[:, :-1]), axis=1, out=lin[:, 1:])
    cdf = np.cumsum(step.ravel()[at].reshape(R, n), axis=1)
    cdf += lin
    np.maximum.accumulate(cdf, axis=1, out=cdf)
    x = _interp_rows(np.broadcast_to(probs, (R, len(probs))), cdf, pos)
    return x + x0[:, None]


_DP = np.diff(P_GRID)
# The mean of a distribution from its quantiles on P_GRID: trapezoids between the points,
# the first point's value below it and the last's beyond it (with_stalls).
_MEAN_W = np.zeros(len(P_GRID))
_MEAN_W[:-1] += 0.5 * _DP
_MEAN_W[1:] += 0.5 * _DP
_MEAN_W[0] += P_GRID[0]
_MEAN_W[-1] += 1.0 - P_GRID[-1]


def _interp_rows(x: np.ndarray, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """``np.interp(x[r], xp[r], fp[r])`` for every row (the same formula and ends), for
    ``xp`` rows in [0, 1] (a CDF): one search over fixed-point keys, rows kept apart."""
    R, n = xp.shape
    scale = float(1 << 40)
    base = np.arange(R, dtype=np.int64)[:, None] << 42
    keys = (np.rint(xp * scale).astype(np.int64) + base).ravel()
    at = np.rint(np.clip(x, -1.0, 2.0) * scale).astype(np.int64) + base
    j = np.searchsorted(keys, at.ravel(), side="right").reshape(x.shape) - 1 - base // (1 << 42) * n
    jc = np.clip(j, 0, n - 2)
    x0, x1 = np.take_along_axis(xp, jc, 1), np.take_along_axis(xp, jc + 1, 1)
    f0, f1 = np.take_along_axis(fp, jc, 1), np.take_along_axis(fp, jc + 1, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = (f1 - f0) / (x1 - x0)
        out = slope * (x - x0) + f0
        out = np.where(np.isnan(out), slope * (x - x1) + f1, out)
    out = np.where(x == x0, f0, out)
    out = np.where(j >= n - 1, fp[:, -1:], out)
    return np.where(j < 0, fp[:, :1], out)


_DELTA = 0.004  # probability step for the density at a quantile (sampling error below)
_PROBS = np.array(STANDARD) / 100.0
_LO = np.maximum(_PROBS - _DELTA, P_GRID[0])
_HI = np.minimum(_PROBS + _DELTA, P_GRID[-1])
_ALL = np.concatenate([_PROBS, _LO, _HI])
_DPROB = _HI - _LO
_PVAR = _PROBS * (1.0 - _PROBS)
_KEPT = (_PROBS, _ALL)  # probability arrays whose interpolation points are kept


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
    monotone. ``rng=None`` gives the true quantiles. One mixture of :func:`observed_many`."""
    parts = np.array([len(weights)])
    return observed_many([rng], np.array([count]), parts, weights, shifts, scales, qfuncs)[0]


def observed_many(
    rngs: list[np.random.Generator | None],
    counts: np.ndarray,
    parts: np.ndarray,
    weights: np.ndarray,
    shifts: np.ndarray,
    scales: np.ndarray,
    qfuncs: np.ndarray,
) -> np.ndarray:
    """:func:`observed` for many monitored groups -> (groups, 4): group ``g`` has
    ``counts[g]`` requests pooled from ``parts[g]`` components (listed as in
    :func:`pooled_quantiles_many`; a group without components reads NaN) and draws its
    sampling error from ``rngs[g]`` (two normal draws of one sample, in group order)."""
    counts = np.asarray(counts)
    pooled = pooled_for_observation(rngs, counts, parts, weights, shifts, scales, qfuncs)
    return observed_pooled(pooled, rngs, counts)


@dataclass(frozen=True)
class Pooled:
    """What :func:`observed_many` computes before drawing sampling errors: the groups with
    components (``rows``), which of them are noise-free (``plain``), and their pooled
    quantiles (``both``: p50/p95/p99/p99.9, then for noisy groups the quantiles either
    side). A function of the components and of which groups are noisy only, so a caller
    whose services sit at the same operating point may keep it (agent/sim/engine.py)."""

    groups: int
    rows: np.ndarray
    plain: np.ndarray
    both: np.ndarray
    slope: np.ndarray | None = None  # dx/dp at the four percentiles, noisy groups' rows


def noisy_groups(
    rngs: Sequence[np.random.Generator | None], counts: np.ndarray, parts: np.ndarray
) -> np.ndarray:
    """Which groups get a sampling error: a stream, requests and components."""
    if isinstance(rngs, Streams):
        have = rngs.present()
    else:
        have = np.array([r is not None for r in rngs], dtype=bool)
    return have & (counts > 0) & (parts > 0)


def pooled_for_observation(
    rngs: list[np.random.Generator | None],
    counts: np.ndarray,
    parts: np.ndarray,
    weights: np.ndarray,
    shifts: np.ndarray,
    scales: np.ndarray,
    qfuncs: np.ndarray,
) -> Pooled | None:
    """The :class:`Pooled` quantiles of :func:`observed_many`'s groups (None: no group
    has a component)."""
    parts = np.asarray(parts)
    some = parts > 0
    if not np.count_nonzero(some):
        return None
    noisy = noisy_groups(rngs, np.asarray(counts), parts)
    rows = np.flatnonzero(some)
    both = np.empty((len(rows), 12))
    plain = ~noisy[rows]
    n_plain = np.count_nonzero(plain)
    # Components of each group with parts, in group order (groups without are skipped).
    if n_plain and n_plain < len(rows):
        first = np.concatenate([[0], np.cumsum(parts)[:-1]])
        sel_p = np.concatenate([first[g] + np.arange(parts[g]) for g in rows[plain]])
        sel_n = np.concatenate([first[g] + np.arange(parts[g]) for g in rows[~plain]])
        pick = (weights, shifts, scales, qfuncs)
        both[plain, :4] = pooled_quantiles_many(
            parts[rows[plain]], *(x[sel_p] for x in pick), _PROBS
        )
        both[~plain] = pooled_quantiles_many(parts[rows[~plain]], *(x[sel_n] for x in pick), _ALL)
    elif n_plain:
        both[:, :4] = pooled_quantiles_many(parts[rows], weights, shifts, scales, qfuncs, _PROBS)
    else:
        both = pooled_quantiles_many(parts[rows], weights, shifts, scales, qfuncs, _ALL)
    slope = None  # of the noisy groups' rows, in order
    if n_plain < len(rows):
        noisy_rows = both[~plain] if n_plain else both
        slope = (noisy_rows[:, 8:] - noisy_rows[:, 4:8]) / _DPROB
    return Pooled(len(parts), rows, plain, both, slope)


def observed_pooled(pooled: Pooled | None, rngs: list, counts: np.ndarray) -> np.ndarray:
    """:func:`observed_many` from its :class:`Pooled` quantiles: the sampling errors drawn
    (``rngs`` and ``counts`` as given there)."""
    if pooled is None:
        return np.full((len(counts), 4), np.nan)
    rows, plain, both, slope = pooled.rows, pooled.plain, pooled.both, pooled.slope
    n_plain = np.count_nonzero(plain)
    if n_plain == len(rows):
        res = both[:, :4].copy()
    elif not n_plain:  # every group noisy: no gathers
        res = _sampled(both, slope, counts[rows], rngs, rows)
    else:
        k = ~plain
        res = both[:, :4].copy()
        res[k] = _sampled(both[k], slope, counts[rows[k]], rngs, rows[k])
    if len(rows) == pooled.groups:
        return res
    out = np.full((pooled.groups, 4), np.nan)
    out[rows] = res
    return out


def _sampled(
    both: np.ndarray, slope: np.ndarray, counts: np.ndarray, rngs: list, rows: np.ndarray
) -> np.ndarray:
    """The percentiles ``both[:, :4]`` of groups ``rows`` plus the sampling error of their
    ``counts`` requests (``slope``: dx/dp = 1 / density there, from ``both[:, 4:]``, the
    quantiles either side)."""
    sd = np.sqrt(_PVAR / counts[:, None]) * slope
    # One sample gives all four: their errors are correlated.
    z = normals(rngs, rows, 5)
    z = 0.8 * z[:, :1] + 0.6 * z[:, 1:]
    return np.sort(np.maximum(both[:, :4] + sd * z, 0.0), axis=1)


if __name__ == "__main__" and "--write" in sys.argv:
    shapes = catalog_shapes()
    write_tables(shapes)
    print(f"wrote {len(shapes)} tables to {TABLES_FILE}")

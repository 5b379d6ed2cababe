"""Fitted workload dynamics: each recorded group's response to its allocation, from a trace.

Offline training must not replay logged counters as if allocations did not matter
(docs/RL.md, the CausalSim caveat): a trace recorded under randomised allocations
(models/explore.py) is turned into a per-group *response model* — how IPC, LLC misses and
references, memory bandwidth, occupancy and (LC) latency depend on the group's cache
ways, its MBA level, its load and its neighbours' memory traffic — that a trace-driven
node (training/trace_node.py) evaluates under allocations the recording never tried
(docs/TRACES.md).

Model (small and parametric, one per group and target; documented in docs/TRACES.md):

- Inputs per interval: ``w`` = effective ways / total ways (ways shared with other active
  groups count 1/sharers: overlapping masks split capacity), lagged by a first-order
  occupancy lag with time constant ``tau_s`` (Ubik's inertia: occupancy follows the mask
  over time, performance follows occupancy); ``m`` = the MB value's share of full
  bandwidth (:func:`models.allocation.mb_fraction`); ``L`` = LC load (completed requests/s
  over the largest seen); ``B`` = the other groups' memory bandwidth / the node's peak
  (contention).
- Basis: piecewise-linear hat functions in ``w`` (17 knots) and ``m`` (11 knots) — a
  response table interpolated between knots, so knees (working sets fitting) are kept —
  plus ``log w * log m, w*m, B, B^2, B*log m, B*log w, L, L^2, L^3, L*log w, L*log m``,
  standardised; ridge least squares per target on log scale (IPC, MPKI,
  references per kilo-instruction, bandwidth, latency percentiles) or linear (occupancy
  share); cycles/s too (an LC service's busy cycles follow its load). Inputs are clipped
  to the recorded range at prediction, so the model never
  extrapolates a polynomial.
- ``tau_s`` is chosen per group from a grid (0..12.8 s) by the IPC and MPKI fit error over
  all intervals, transients included: a group with few misses fills its ways slowly.
- Residual spread (log-scale std) per target is kept so a replay can add matching noise.

Bandwidth couples groups (``B``); :meth:`Dynamics.predict` solves it by fixed-point
iteration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from agent.types import GroupAllocation, GroupKind, GroupSpec, NodeCapabilities
from models.allocation import mb_fraction, mb_scale
from training.traces import Trace

LATENCY_KEYS = ("p50", "p95", "p99", "p999")
LOG_TARGETS = ("ipc", "cps", "mpki", "apki", "bw", *LATENCY_KEYS)
TARGETS = (*LOG_TARGETS, "occ")
INPUTS = ("w", "m", "B", "L", "o")
TAU_GRID = (0.0, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8)
_EPS = 1e-9


W_KNOTS = np.linspace(0.0, 1.0, 17)
M_KNOTS = np.linspace(0.0, 1.0, 11)


def hats(v: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """Piecewise-linear "hat" functions at ``knots`` (a tabular, interpolated response)."""
    v = np.clip(v, knots[0], knots[-1])
    h = knots[1] - knots[0]
    return np.maximum(0.0, 1.0 - np.abs(v[:, None] - knots[None, :]) / h)


def basis(x: np.ndarray) -> np.ndarray:
    """The regression basis of inputs ``x`` (N x 5: w, m, B, L, o): hat functions in ways,
    occupancy and MBA (a response table with knees where the data has them) plus smooth
    interaction, contention and load terms."""
    w = np.maximum(x[:, 0], 1e-3)
    m = np.maximum(x[:, 1], 1e-3)
    b, load = x[:, 2], x[:, 3]
    o = np.maximum(x[:, 4], 1e-3)
    lw, lm, lo = np.log(w), np.log(m), np.log(o)
    cols = [
        np.ones_like(w), lw * lm, w * m, lo * lm, o * m, o * w,
        b, b * b, b * lm, b * lo, load, load**2, load**3, load * lo, load * lm,
    ]  # fmt: skip
    return np.concatenate(
        [np.stack(cols, axis=1), hats(w, W_KNOTS), hats(o, W_KNOTS), hats(m, M_KNOTS)], axis=1
    )


@dataclass
class Regression:
    """Ridge regression on the standardised basis; ``sigma``: residual std (target scale)."""

    coef: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    sigma: float
    n: int

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, ridge: float = 1e-3) -> Regression:
        phi = basis(x)
        mean = phi.mean(axis=0)
        scale = phi.std(axis=0)
        mean[0], scale[0] = 0.0, 1.0
        scale[scale < 1e-9] = np.inf  # constant columns drop out
        z = (phi - mean) / scale
        a = z.T @ z + ridge * len(y) * np.eye(z.shape[1])
        a[0, 0] -= ridge * len(y)  # do not shrink the intercept
        coef = np.linalg.solve(a, z.T @ y)
        resid = y - z @ coef
        return cls(coef, mean, scale, float(resid.std()) if len(y) > 1 else 0.0, len(y))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return ((basis(x) - self.mean) / self.scale) @ self.coef


@dataclass
class GroupDynamics:
    """One group's fitted response (see the module docstring).

    Attributes:
        spec: the group's spec (kind, SLO).
        models: target -> regression (missing targets: not measured in the trace).
        cycles_rate: cycles/s when active (median).
        lo, hi: the recorded range of each input (predictions clip to it).
        max_load_rps: the load that ``L = 1`` stands for (LC groups).
        samples: intervals used for the fit.
    """

    spec: GroupSpec
    models: dict[str, Regression]
    cycles_rate: float
    lo: np.ndarray
    hi: np.ndarray
    max_load_rps: float = 0.0
    samples: int = 0
    tau_s: float = 0.0
    state: bool = False

    def fold(self) -> None:
        """Fold each target's standardisation into one weight matrix (``_w``, ``_b``)."""
        if getattr(self, "_w", None) is None:
            # Fold each target's standardisation into one weight matrix: one basis and one
            # matrix product per call (a replay step stays well under a millisecond).
            names = list(self.models)
            w = np.stack([r.coef / r.scale for r in self.models.values()], axis=1)
            b = np.array([-(r.mean / r.scale) @ r.coef for r in self.models.values()])
            log = np.array([n in LOG_TARGETS for n in names])
            self._w, self._b, self._names, self._log = w, b, names, log

    def predict(self, x: np.ndarray) -> dict[str, np.ndarray]:
        if not self.models:
            return {}
        self.fold()
        return self.from_basis(basis(np.clip(x, self.lo, self.hi)))

    def from_basis(self, phi: np.ndarray) -> dict[str, np.ndarray]:
        v = phi @ self._w + self._b
        v = np.where(self._log, np.exp(np.minimum(v, 700.0)), np.clip(v, 0.0, 1.0))
        return {n: v[..., i : i + 1] for i, n in enumerate(self._names)}


@dataclass(frozen=True)
class Prediction:
    """Predicted per-second rates and gauges of one group over an interval."""

    ips: float
    cycles_rate: float
    refs_rate: float
    miss_rate: float
    bw_bps: float
    occupancy_bytes: float
    latency_ms: Mapping[str, float] = field(default_factory=dict)
    occupancy_share: float = 0.0  # the state at the interval's end (occupancy models)


@dataclass
class Dynamics:
    """Every recorded group's response, plus what the node is (see the module docstring)."""

    capabilities: NodeCapabilities
    groups: dict[str, GroupDynamics]
    peak_bps: float
    cache_bytes: float
    fit_error: dict[str, float] = field(default_factory=dict)
    interval_s: float = 0.1  # the recording's interval: one step of the occupancy state

    # ------------------------------------------------------------------ prediction

    def inputs(
        self,
        eff_ways: Mapping[str, float],
        mb: Mapping[str, int | None],
        loads_rps: Mapping[str, float],
        others_bw: Mapping[str, float],
        occupancy: Mapping[str, float] | None = None,
    ) -> dict[str, np.ndarray]:
        caps = self.capabilities
        ways = caps.l3.num_ways if caps.l3 else 1
        out = {}
        for g in eff_ways:
            d = self.groups[g]
            w = eff_ways[g] / ways if caps.l3 else 1.0
            m = mb_fraction(caps, mb.get(g) or caps.mba.max_bandwidth) if caps.mba else 1.0
            load = loads_rps.get(g, 0.0) / d.max_load_rps if d.max_load_rps > 0 else 0.0
            o = occupancy.get(g, w) if (d.state and occupancy is not None) else w
            out[g] = np.array([[w, m, others_bw.get(g, 0.0) / self.peak_bps, load, o]])
        return out

    def predict(
        self,
        eff_ways: Mapping[str, float],
        mb: Mapping[str, int | None],
        loads_rps: Mapping[str, float] | None = None,
        iterations: int = 3,
        occupancy: Mapping[str, float] | None = None,
        settle_steps: int = 600,
        bw_start: Mapping[str, float] | None = None,
    ) -> dict[str, Prediction]:
        """Predictions for the active groups named in ``eff_ways`` (effective ways, after
        sharing and lag) at MB values ``mb`` and LC loads ``loads_rps`` (req/s).

        ``occupancy``: each group's occupancy share at the start of the interval (the state
        of groups fitted with an occupancy model); the prediction for one recorded interval
        follows, with the state at its end in ``occupancy_share``. None: the steady state,
        found by stepping the state (at most ``settle_steps`` intervals) until it settles.
        ``bw_start``: a first guess of each group's bandwidth for the fixed point (a replay
        passes the previous step's, and one iteration then suffices).
        """
        if occupancy is None and any(self.groups[g].state for g in eff_ways if g in self.groups):
            occ = {g: 0.0 for g in eff_ways}
            pred: dict[str, Prediction] = {}
            for _ in range(settle_steps):
                pred = self.predict(eff_ways, mb, loads_rps, iterations, occ)
                new = {g: p.occupancy_share for g, p in pred.items()}
                if all(abs(new[g] - occ.get(g, 0.0)) < 1e-5 for g in new):
                    break
                occ = new
            return pred
        loads_rps = loads_rps or {}
        names = [g for g in eff_ways if g in self.groups and self.groups[g].models]
        bw = {g: (bw_start or {}).get(g, 0.0) for g in names}
        raw: dict[str, dict[str, np.ndarray]] = {}
        total = 0.0
        if not names:
            return {}
        lo = np.stack([self.groups[g].lo for g in names])
        hi = np.stack([self.groups[g].hi for g in names])
        for g in names:
            self.groups[g].fold()
        for _ in range(max(1, iterations)):
            total = sum(bw.values())
            others = {g: total - bw[g] for g in names}
            x = self.inputs({g: eff_ways[g] for g in names}, mb, loads_rps, others, occupancy)
            # One basis for every group (rows), then each group's own weights.
            phi = basis(np.clip(np.concatenate([x[g] for g in names]), lo, hi))
            raw = {g: self.groups[g].from_basis(phi[i]) for i, g in enumerate(names)}
            new = {g: _bw(raw[g], self.groups[g]) for g in names}
            if all(abs(new[g] - bw[g]) <= 1e-3 * (bw[g] + 1.0) for g in names):
                bw = new
                break
            bw = new
        out = {}
        for g in names:
            d, r = self.groups[g], raw[g]
            cps = float(r["cps"][0]) if "cps" in r else d.cycles_rate
            ips = float(r["ipc"][0]) * cps if "ipc" in r else 0.0
            lat = {k: float(r[k][0]) for k in LATENCY_KEYS if k in r}
            out[g] = Prediction(
                ips=ips,
                cycles_rate=cps,
                refs_rate=float(r["apki"][0]) * ips / 1000.0 if "apki" in r else 0.0,
                miss_rate=float(r["mpki"][0]) * ips / 1000.0 if "mpki" in r else 0.0,
                bw_bps=bw[g],
                occupancy_bytes=float(r["occ"][0]) * self.cache_bytes if "occ" in r else 0.0,
                latency_ms=lat,
                occupancy_share=float(r["occ"][0]) if "occ" in r else 0.0,
            )
        return out


def _bw(raw: Mapping[str, np.ndarray], d: GroupDynamics) -> float:
    return float(raw["bw"][0]) if "bw" in raw else 0.0


# --------------------------------------------------------------------------- sharing and lag


def effective_ways(
    masks: Mapping[str, int | None], caps: NodeCapabilities, active: Sequence[str] | None = None
) -> dict[str, float]:
    """Ways each group may fill, a way shared by k active groups counting 1/k."""
    if caps.l3 is None:
        return dict.fromkeys(masks, 1.0)
    full = caps.l3.cbm_mask
    act = list(masks) if active is None else [g for g in masks if g in set(active)]
    sharers: dict[int, int] = {}
    for g in act:
        m = masks[g] if masks[g] is not None else full
        for bit in range(full.bit_length()):
            if m >> bit & 1:
                sharers[bit] = sharers.get(bit, 0) + 1
    out = {}
    for g in masks:
        m = masks[g] if masks[g] is not None else full
        out[g] = sum(
            1.0 / max(1, sharers.get(b, 0) + (g not in act))
            for b in range(full.bit_length())
            if m >> b & 1
        )
    return out


def lag(target: np.ndarray, dt: np.ndarray, tau_s: float, start: float | None = None) -> np.ndarray:
    """First-order lag of ``target`` (the value in force during each interval) with time
    constant ``tau_s``: the interval's mean state, starting settled at ``start``."""
    if tau_s <= 0:
        return target.copy()
    out = np.empty_like(target)
    s = target[0] if start is None else start
    for i, (y, h) in enumerate(zip(target, dt, strict=True)):
        a = math.exp(-h / tau_s) if h > 0 else 1.0
        # mean over the interval of s(t) -> y: y + (s - y) * tau/h * (1 - a)
        frac = tau_s / h * (1.0 - a) if h > 0 else 1.0
        out[i] = y + (s - y) * frac
        s = y + (s - y) * a
    return out


# --------------------------------------------------------------------------- fitting


@dataclass
class _Series:
    ways: np.ndarray  # effective ways (before lag)
    mb: np.ndarray
    dt: np.ndarray
    active: np.ndarray
    y: dict[str, np.ndarray]
    load: np.ndarray
    bw: np.ndarray
    cycles_rate: np.ndarray


def _series(trace: Trace) -> dict[str, _Series]:
    caps = trace.capabilities
    dom = caps.domains[0]
    names = list(trace.groups)
    n = len(trace.steps)
    full = caps.l3.cbm_mask if caps.l3 else None
    mbmax = caps.mba.max_bandwidth if caps.mba else None
    cols = {g: {k: np.full(n, np.nan) for k in (*TARGETS, "ips", "load", "cyc")} for g in names}
    masks = {g: np.zeros(n, dtype=object) for g in names}
    mbs = {g: np.full(n, float(mbmax or 1)) for g in names}
    present = {g: np.zeros(n, dtype=bool) for g in names}
    dt = np.array([s.snapshot.interval_s for s in trace.steps], dtype=float)
    cache = caps.l3.size_bytes if caps.l3 and caps.l3.size_bytes else None
    for i, step in enumerate(trace.steps):
        h = step.snapshot.interval_s
        for g, s in step.snapshot.groups.items():
            a = step.allocation.get(g, dom)
            masks[g][i] = a.l3_mask if a and a.l3_mask is not None else full
            if a is not None and a.mb is not None:
                mbs[g][i] = a.mb
            if h <= 0 or s.instructions is None or s.cycles is None:
                continue
            c = cols[g]
            present[g][i] = True
            c["ips"][i] = s.instructions / h
            c["cyc"][i] = c["cps"][i] = s.cycles / h
            if s.cycles > 0:
                c["ipc"][i] = s.instructions / s.cycles
            if s.instructions > 0:
                if s.llc_misses is not None:
                    c["mpki"][i] = 1000.0 * s.llc_misses / s.instructions
                if s.llc_references is not None:
                    c["apki"][i] = 1000.0 * s.llc_references / s.instructions
            if s.memory_bytes is not None:
                c["bw"][i] = s.memory_bytes / h
            if s.llc_occupancy_bytes is not None and cache:
                c["occ"][i] = s.llc_occupancy_bytes / cache
            if s.latency is not None:
                c["load"][i] = s.latency.count / h
                if s.latency.count > 0:
                    for k, v in zip(
                        LATENCY_KEYS,
                        (s.latency.p50_ms, s.latency.p95_ms, s.latency.p99_ms, s.latency.p999_ms),
                        strict=True,
                    ):
                        c[k][i] = v
    # Active: the group ran this interval (batch jobs may arrive and leave).
    active = {}
    for g in names:
        ips = cols[g]["ips"]
        ref = np.nanmedian(ips[present[g]]) if present[g].any() else 0.0
        active[g] = present[g] & (np.nan_to_num(ips) > 0.02 * ref)
    eff = {g: np.zeros(n) for g in names}
    for i in range(n):
        act = [g for g in names if active[g][i]]
        e = effective_ways({g: (masks[g][i] or full) for g in names}, caps, act)
        for g in names:
            eff[g][i] = e[g]
    out = {}
    for g in names:
        c = cols[g]
        out[g] = _Series(
            ways=eff[g],
            mb=mbs[g],
            dt=dt,
            active=active[g],
            y={k: c[k] for k in TARGETS},
            load=np.nan_to_num(c["load"]),
            bw=np.nan_to_num(c["bw"]),
            cycles_rate=c["cyc"],
        )
    return out


def fit_dynamics(
    trace: Trace,
    *,
    tau_grid: Sequence[float] = TAU_GRID,
    ridge: float = 1e-3,
    min_samples: int = 20,
) -> Dynamics:
    """Fit every group's response from ``trace`` (best recorded with ``explore``).

    Raises ValueError when a group has fewer than ``min_samples`` active intervals.
    """
    caps = trace.capabilities
    series = _series(trace)
    if not series:
        raise ValueError(f"trace {trace.path} has no groups to fit")
    peak = caps.memory_bandwidth_bps or max(1.0, float(np.max(sum(s.bw for s in series.values()))))
    cache = float(caps.l3.size_bytes) if caps.l3 and caps.l3.size_bytes else 1.0
    ways = caps.l3.num_ways if caps.l3 else 1
    scale = mb_scale(caps)
    total_bw = sum(s.bw for s in series.values())
    fitted: dict[str, GroupDynamics] = {}
    for g, s in series.items():
        if s.active.sum() < min_samples:
            raise ValueError(
                f"trace {trace.path}: group {g!r} is active in only {int(s.active.sum())} "
                f"intervals; need at least {min_samples} to fit its response"
            )
        m = np.minimum(1.0, s.mb / scale) if scale > 0 else np.ones_like(s.mb)
        b = (total_bw - s.bw) / peak
        max_load = float(s.load.max())
        load = s.load / max_load if max_load > 0 else np.zeros_like(s.load)
        occ = s.y["occ"]
        # With occupancy measured (CMT), it is the state: performance follows the occupancy
        # at the interval's start, and the occupancy at its end is fitted as a transition
        # (from the start occupancy, the mask, MBA, load, contention). Without it, the
        # mask's effect is lagged by a per-group time constant instead.
        state = bool(np.isfinite(occ[s.active]).mean() > 0.9) if s.active.any() else False
        o_start = np.concatenate([[occ[0]], occ[:-1]]) if state else None
        best: tuple[float, GroupDynamics] | None = None
        # Each group fills its ways at its own pace (about one line per miss): its lag is
        # chosen per group, by the fit error of IPC and MPKI over every interval.
        for tau in (0.0,) if state else tau_grid:
            w = lag(s.ways, s.dt, tau) / ways if caps.l3 else np.ones_like(s.ways)
            o = np.nan_to_num(o_start, nan=0.0) if state else w
            x = np.stack([w, m, b, load, o], axis=1)
            models = {}
            for name in TARGETS:
                y = s.y[name]
                ok = s.active & np.isfinite(y)
                if name in LOG_TARGETS:
                    ok &= y > 0
                if ok.sum() < min_samples:
                    continue
                if state:
                    ok &= np.isfinite(o_start)
                yy = np.log(y[ok]) if name in LOG_TARGETS else y[ok]
                models[name] = Regression.fit(x[ok], yy, ridge)
            score = sum(models[k].sigma ** 2 for k in ("ipc", "mpki") if k in models)
            xa = x[s.active]
            cand = GroupDynamics(
                spec=trace.groups[g],
                models=models,
                cycles_rate=float(np.nanmedian(s.cycles_rate[s.active])),
                lo=xa.min(axis=0),
                hi=xa.max(axis=0),
                max_load_rps=max_load,
                samples=int(s.active.sum()),
                tau_s=float(tau),
                state=state,
            )
            if best is None or score < best[0] - 1e-12:
                best = (score, cand)
        fitted[g] = best[1]
    errors = {f"{g}.{k}": r.sigma for g, d in fitted.items() for k, r in d.models.items()}
    return Dynamics(caps, fitted, peak, cache, errors, trace.interval_s or 0.1)


def is_lc(spec: GroupSpec) -> bool:
    return spec.kind is GroupKind.LC


def allocation_inputs(
    alloc: Mapping[str, GroupAllocation], caps: NodeCapabilities
) -> tuple[dict[str, int | None], dict[str, int | None]]:
    """(masks, mb) per group from per-group allocations."""
    full = caps.l3.cbm_mask if caps.l3 else None
    return (
        {g: (a.l3_mask if a.l3_mask is not None else full) for g, a in alloc.items()},
        {g: a.mb for g, a in alloc.items()},
    )

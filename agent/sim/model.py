"""The performance model of the simulated node, vectorised over workload instances.

Implements effects 1-5 and 7 of shared/design/SIMULATOR.md (the equations are written out
in docs/SIMULATOR.md):

1. miss-ratio curves ``m(c)`` per workload (knees, streaming floor, insensitive);
2. CAT semantics: a workload inserts only into the ways of its group's mask, hits on any
   line it holds; occupancy of a way splits by insertion (miss) rate; associativity
   shrinks the effective capacity of small masks;
3. inertia: occupancy per (workload, way) evolves with the exact solution of the fill /
   replace dynamics over a step (about one line per miss, evicted by other inserters);
4. memory bandwidth contention: one shared memory latency ``L(u)`` rising steeply with
   utilisation ``u`` of the peak, solved as a fixed point with the CPI of every workload;
5. MBA: Intel levels add a per-request delay to L2->LLC traffic (non-linear in the level,
   per core, so a group's bandwidth scales with its cores; hits pay a share too); AMD
   values are absolute bandwidth caps;
7. CPI -> instructions/s for batch jobs (with phases), LC services demand-driven.

No per-request work happens here (LC queues are in :mod:`agent.sim.queueing`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from agent.sim.catalog import MachinePreset, WorkloadSpec

LINE = 64.0
U_MAX = 0.995


@dataclass
class Inputs:
    """Per-workload inputs of one solve (arrays of length n, masks n x ways)."""

    masks: np.ndarray  # (n, W) float 0/1: ways the workload may insert into
    nways: np.ndarray  # (n,) ways in that mask (>= 1)
    delay_ns: np.ndarray  # (n,) MBA delay per request
    bw_cap: np.ndarray  # (n,) bytes/s cap (inf: none)
    active: np.ndarray  # (n,) 0/1
    apki_s: np.ndarray  # phase multipliers
    ws_s: np.ndarray
    cpi_s: np.ndarray
    lam: np.ndarray  # (n,) LC request rate (req/s); 0 for batch
    cores: np.ndarray  # (n,) cores the workload runs on (after oversubscription)
    unmask: np.ndarray | None = None  # 1 - masks, filled in lazily
    assoc: np.ndarray | None = None  # associativity factor of nways, filled in lazily


@dataclass
class Solution:
    """Per-workload rates at one operating point."""

    ips: np.ndarray
    cpi: np.ndarray
    miss_ratio: np.ndarray
    access_rate: np.ndarray  # LLC references/s
    miss_rate: np.ndarray  # LLC misses/s
    mem_bw: np.ndarray  # bytes/s (misses x 64 x (1 + write-back))
    capacity: np.ndarray  # effective capacity (bytes)
    service_s: np.ndarray  # LC mean service time (s); 0 for batch
    busy: np.ndarray  # busy cores (LC: utilisation x workers)
    latency_ns: float
    utilization: float


class Model:
    """Constant per-workload parameters plus the solver; state (occupancy, latency) is
    passed in and out so callers can evaluate counterfactuals without side effects."""

    def __init__(self, preset: MachinePreset, specs: list[WorkloadSpec], threads: list[int]):
        self.preset = preset
        self.specs = specs
        n = len(specs)
        self.n = n
        self.W = preset.ways
        self.way_bytes = preset.way_bytes
        self.freq = preset.freq_ghz  # cycles per ns
        f = np.array
        self.threads = f(threads, dtype=float)
        self.cpi_base = f([s.cpi_base for s in specs], dtype=float)
        self.apki = f([s.apki for s in specs], dtype=float)
        self.mlp = f([s.mlp for s in specs], dtype=float)
        self.wb = f([s.writeback for s in specs], dtype=float)
        self.fp = f([s.footprint_bytes for s in specs], dtype=float)
        self.floor = f([s.mrc_floor for s in specs], dtype=float)
        self.span = f([s.mrc_ceil - s.mrc_floor for s in specs], dtype=float)
        k = max([len(s.knees) for s in specs] + [1])
        self.kw = np.zeros((n, k))
        self.kk = np.ones((n, k))
        self.ks = np.ones((n, k))
        for i, s in enumerate(specs):
            for j, (w, size, sh) in enumerate(s.knees):
                self.kw[i, j], self.kk[i, j], self.ks[i, j] = w, size, sh
        self.is_lc = f([s.kind == "lc" for s in specs], dtype=bool)
        self.ipr = f([s.lc.instructions_per_request if s.lc else 0.0 for s in specs])
        self.L0 = preset.mem_latency_ns
        self.beta = preset.queueing_beta
        self.a0 = preset.assoc_a0
        self.hit_share = preset.mba_hit_share
        self.peak = preset.peak_bw_bps
        self.inclusive = preset.llc_inclusive
        self._assoc_full = self.W / (self.W + self.a0)

    # ------------------------------------------------------------------ pieces

    def assoc(self, nways: np.ndarray) -> np.ndarray:
        """Effective-capacity factor of a mask with ``nways`` ways (1 with every way)."""
        return (nways / (nways + self.a0)) / self._assoc_full

    def miss_ratio(self, capacity: np.ndarray, ws_s: np.ndarray) -> np.ndarray:
        x = capacity[:, None] / (self.kk * ws_s[:, None])
        return self.floor + self.span * (self.kw / (1.0 + x**self.ks)).sum(axis=1)

    def latency(self, u: float) -> float:
        u = min(max(u, 0.0), U_MAX)
        return self.L0 * (1.0 + self.beta * u * u / (1.0 - u))

    def solve(
        self, inp: Inputs, occ: np.ndarray, u_guess: float = 0.0, tol: float = 1e-6
    ) -> Solution:
        """Rates at the fixed point of CPI <-> bandwidth <-> memory latency, for the
        occupancy ``occ`` (n x W bytes) held now."""
        if inp.assoc is None:
            inp.assoc = self.assoc(inp.nways)
        cap = occ.sum(axis=1) * inp.assoc
        m = self.miss_ratio(cap, inp.ws_s)
        apki = self.apki * inp.apki_s
        fm = self.freq / self.mlp * apki / 1000.0
        # cpi = a + b * L   (L in ns)
        a = self.cpi_base * inp.cpi_s + fm * (m + self.hit_share) * inp.delay_ns
        b = fm * m
        hz = self.freq * 1e9
        k_cpu = inp.active * inp.cores * hz
        # LC services are demand-driven (lam is 0 and ipr 0 for batch jobs: no cap there).
        lc_cap = np.where(self.is_lc, inp.lam * self.ipr * inp.active, np.inf)
        bpi = apki / 1000.0 * m * LINE * (1.0 + self.wb)  # memory bytes per instruction
        capped = bool(np.isfinite(inp.bw_cap).any())
        peak = self.peak
        L0, beta = self.L0, self.beta

        def ips_at(u: float) -> tuple[np.ndarray, float]:
            uu = min(max(u, 0.0), U_MAX)
            lat = L0 * (1.0 + beta * uu * uu / (1.0 - uu))
            ips = np.minimum(k_cpu / (a + b * lat), lc_cap)
            if capped:
                dem = ips * bpi
                ratio = dem / inp.bw_cap
                ips = ips / (1.0 + ratio**4) ** 0.25
            return ips, lat

        def h(u: float) -> tuple[float, np.ndarray, float]:
            ips, lat = ips_at(u)
            return float(ips @ bpi) / peak - u, ips, lat

        # The map u -> demand(u)/peak is decreasing, so the fixed point lies between a guess
        # and its image: bracket there and refine with Illinois regula falsi.
        u0 = min(max(u_guess, 0.0), U_MAX)
        h0, ips, lat = h(u0)
        if abs(h0) > tol:
            u1 = min(max(u0 + h0, 0.0), U_MAX)
            h1, ips, lat = h(u1)
            lo, hlo, hi, hhi = (u0, h0, u1, h1) if h0 > 0 else (u1, h1, u0, h0)
            if hlo < 0 or hhi > 0:  # clipped at the ends: widen to the whole range
                lo, hi = 0.0, U_MAX
                hlo, _, _ = h(lo)
                hhi, _, _ = h(hi)
            u = u1
            side = 0
            for _ in range(60):
                if hhi >= 0:
                    u, ips, lat = hi, *ips_at(hi)
                    break
                if hlo <= 0:
                    u, ips, lat = lo, *ips_at(lo)
                    break
                u = (lo * hhi - hi * hlo) / (hhi - hlo)
                hu, ips, lat = h(u)
                if abs(hu) <= tol or hi - lo < 1e-9:
                    break
                if hu > 0:
                    lo, hlo = u, hu
                    if side == 1:
                        hhi *= 0.5
                    side = 1
                else:
                    hi, hhi = u, hu
                    if side == -1:
                        hlo *= 0.5
                    side = -1
            u0 = u
        cpi = a + b * lat
        access = ips * apki / 1000.0
        miss = access * m
        bw = ips * bpi
        service = self.ipr * cpi / hz
        busy = np.where(self.is_lc, ips * cpi / hz, inp.active * inp.cores)
        return Solution(ips, cpi, m, access, miss, bw, cap, service, busy, lat, float(u0))

    # ------------------------------------------------------------------ occupancy

    def step_occupancy(
        self,
        occ: np.ndarray,
        inp: Inputs,
        miss_rate: np.ndarray,
        dt: float,
        hit_rate: np.ndarray | None = None,
    ) -> np.ndarray:
        """Occupancy after ``dt`` s with constant insertion: free space fills first, then
        each inserted line evicts a line of the way chosen in proportion to occupancy.

        On a non-inclusive LLC (``hit_rate`` given), a line hit outside the workload's
        mask moves to its L2 and re-enters the LLC on L2 eviction through the current
        mask: out-of-mask lines migrate into the mask at their hit rate.
        """
        wb = self.way_bytes
        if hit_rate is not None and not self.inclusive:
            if inp.unmask is None:
                inp.unmask = 1.0 - inp.masks
            outside = occ * inp.unmask
        if hit_rate is not None and not self.inclusive and outside.max(initial=0.0) > LINE:
            lines = np.maximum(occ.sum(axis=1), LINE) / LINE
            moved_frac = 1.0 - np.exp(-(hit_rate / lines) * dt)
            moved = outside * moved_frac[:, None]
            occ = occ - moved
            miss_rate = miss_rate + moved.sum(axis=1) / (LINE * dt)
        ins = inp.masks * (miss_rate * (LINE / inp.nways))[:, None]  # bytes/s per (w, way)
        rate = ins.sum(axis=0)  # (W,)
        inv = 1.0 / np.maximum(rate, 1e-30)
        free = wb - occ.sum(axis=0)
        np.maximum(free, 0.0, out=free)
        t1 = np.minimum(free * inv, dt)  # time to fill the free space
        occ = occ + ins * t1
        ss = ins * (wb * inv)  # split by insertion rate (0 where nobody inserts)
        decay = np.exp(rate * (t1 - dt) / wb)  # 1 where the way never filled
        occ -= ss
        occ *= decay
        occ += ss
        tot = occ.sum(axis=1)
        limit = self.fp * inp.ws_s
        over = tot > limit
        if over.any():
            # A workload holds at most its footprint: its inserts replace its own lines in
            # the ways it inserts into (LRU within the mask) before any others.
            for i in np.flatnonzero(over):
                excess = tot[i] - limit[i]
                row = occ[i]
                inside = row * inp.masks[i]
                held_in = inside.sum()
                take = min(excess, held_in)
                if held_in > 0:
                    row -= inside * (take / held_in)
                if excess > take:
                    row *= limit[i] / row.sum()
        return occ

    def advance_occupancy(
        self, occ: np.ndarray, inp: Inputs, sol: Solution, dt: float
    ) -> np.ndarray:
        """Occupancy after ``dt`` s. Insertion runs at the miss rate of the step's midpoint
        (predictor-corrector): holding the start's miss rate for a whole step over-shoots
        when fills are faster than a step and makes occupancy oscillate."""
        hits = None if self.inclusive else sol.access_rate - sol.miss_rate
        pred = self.step_occupancy(occ, inp, sol.miss_rate, dt, hits)
        mid = 0.5 * (occ + pred)
        m = self.miss_ratio(mid.sum(axis=1) * inp.assoc, inp.ws_s)
        if hits is not None:
            hits = sol.access_rate * (1.0 - m)
        return self.step_occupancy(occ, inp, sol.access_rate * m, dt, hits)

    def steady(
        self, inp: Inputs, occ: np.ndarray | None = None, iters: int = 300
    ) -> tuple[np.ndarray, Solution]:
        """Converged occupancy and rates for constant inputs (noise-free ground truth)."""
        if occ is None:
            occ = np.zeros((self.n, self.W))
        sol = self.solve(inp, occ)
        for _ in range(iters):
            new = self.advance_occupancy(occ, inp, sol, 0.1)
            sol = self.solve(inp, new, sol.utilization, tol=1e-10)
            done = np.abs(new - occ).max(initial=0.0) < 0.5
            occ = new
            if done:
                break
        return occ, sol


def amd_cap_bps(value: int) -> float:
    """AMD L3 QoS bandwidth limit: ``value`` in 1/8 GB/s units (a floor keeps 0 finite)."""
    return max(float(value), 0.2) * 0.125e9 if math.isfinite(value) else math.inf

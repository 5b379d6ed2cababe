"""The operating point and the occupancy step of each simulated node, compiled.

:class:`agent.sim.model.Model` owns the parameters and the API; this module owns the
arithmetic of its two per-step solves (docs/SIMULATOR.md, "Equations") and of the loop of
them that finds a node's steady state:

* :func:`solve`: the rates at the fixed point of CPI <-> bandwidth <-> memory latency for
  the occupancy held now (effects 1, 4, 5 and 7);
* :func:`advance`: the occupancy after a step, with insertion at the miss ratio and access
  rate of the step's end (backward Euler, effect 3; CAT semantics, effect 2);
* :func:`steady`: the two, step after step, until the occupancy stops moving (a warm
  start, and the noise-free truth the oracle and the facts read).

Each node is solved on its own, in a loop over nodes: a node's numbers never depend on
which nodes share its batch, and a converged node costs nothing while others iterate.
Compiled with numba (no fast-math: every operation rounds as IEEE arithmetic says), because
the same equations as numpy array code cost a microsecond per operation on a node's few
dozen numbers, and a moving step makes several hundred of them. The code is plain Python
over numpy arrays and scalars: where numba is not installed (the node agent's base
install, ``rdtune[sim]`` adds it) the same functions run uncompiled, slower but alike.
The helpers the solvers call in their loops are compiled into their callers
(:func:`agent.compiled.inline`).

Arrays are packed by :meth:`Model._packed` and :func:`pack_inputs` into a few
(nodes, workloads, field) arrays; the field indices below name their columns.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from agent.compiled import AVAILABLE
from agent.compiled import inline as _inline
from agent.compiled import jit as _jit

if not AVAILABLE:  # pragma: no cover - the base install
    warnings.warn(
        "numba is not installed: the simulator runs uncompiled, a node a few times "
        "slower and a batch of nodes tens of times (pip install 'rdtune[sim]')",
        RuntimeWarning,
        stacklevel=2,
    )

LINE = 64.0
U_MAX = 1.0 - 1e-7  # the queue term diverges there: demand can never exceed the peak

# Machine fields, (nodes, field).
WAY_BYTES, FREQ, HZ, L0, LAT_SLOPE, LAT_QUEUE, HIT_SHARE, PEAK, NON_INCLUSIVE = range(9)
MACHINE_FIELDS = 9
# Workload fields, (nodes, workloads, field).
(
    CPI_BASE,
    APKI,
    MLP,
    WB,
    FP,
    FLOOR,
    SPAN,
    IS_LC,
    IPR,
    BURST,
    REUSE,
    IO_S,
    DMA,
    WORKERS,
) = range(14)
WORKLOAD_FIELDS = 14
# Miss-curve knees, (nodes, workloads, knees, field).
KW, KR, KS, KEND = range(4)
# Inputs, (nodes, workloads, field).
NWAYS, DELAY_NS, BW_CAP, ACTIVE, APKI_S, WS_S, CPI_S, LAM, CORES, HOLD_CAP = range(10)
INPUT_FIELDS = 10
# Solution fields, (field, nodes, workloads).
IPS, CPI, MISS_RATIO, ACCESS_RATE, MISS_RATE, MEM_BW, CAPACITY, SERVICE_S, BUSY, RHO = range(10)
SOLUTION_FIELDS = 10

# How a node's MB values become inputs (agent/sim/batch.py's MbaRule).
MBA_NONE, MBA_PERCENT, MBA_AMD, MBA_MBPS = 0, 1, 2, 3


def pack_inputs(inp) -> np.ndarray:
    """The (nodes, workloads, INPUT_FIELDS) array of an :class:`agent.sim.model.Inputs`
    (its ``hold_cap`` already set)."""
    return np.stack(
        (
            inp.nways,
            inp.delay_ns,
            inp.bw_cap,
            inp.active,
            inp.apki_s,
            inp.ws_s,
            inp.cpi_s,
            inp.lam,
            inp.cores,
            inp.hold_cap,
        ),
        axis=-1,
    )


# ---------------------------------------------------------------------- pieces


@_inline
def latency(mach, b, u):
    """Loaded memory latency (ns) of node ``b`` at utilisation ``u`` of its peak."""
    u = min(max(u, 0.0), U_MAX)
    return mach[b, L0] * (1.0 + mach[b, LAT_SLOPE] * u + mach[b, LAT_QUEUE] * u / (1.0 - u))


@_inline
def _miss_ratio(wl, knees, b, i, held, ws_s):
    """m(c) of workload ``i``: ``held`` bytes of its footprint scaled by ``ws_s``."""
    x = min(held / (wl[b, i, FP] * ws_s), 1.0)
    s = 0.0
    for k in range(knees.shape[2]):
        kend = knees[b, i, k, KEND]
        g = (1.0 / (1.0 + (x / knees[b, i, k, KR]) ** knees[b, i, k, KS]) - kend) / (1.0 - kend)
        s += knees[b, i, k, KW] * g
    return wl[b, i, FLOOR] + wl[b, i, SPAN] * s


@_inline
def _cold_misses(wl, x, b, i, m, rho, eta):
    """Extra miss ratio of an LC service from lines evicted while it idled (0 for batch).

    Bursts of requests arrive at ``lam / burst``; a burst that finds every worker idle
    (probability ``(1 - rho)^workers``) follows an idle gap ~ Exp(lam / burst), during
    which a line it holds is evicted at rate ``eta`` (others' insertions into its ways).
    Its first request re-misses the lost share of its cross-request reuse."""
    lam = x[b, i, LAM] * x[b, i, ACTIVE]
    if wl[b, i, IS_LC] == 0.0 or not lam > 0.0:
        return 0.0
    idle = max(1.0 - rho, 0.0) ** wl[b, i, WORKERS]
    lost = idle * eta / (wl[b, i, BURST] * eta + lam + 1e-30)
    return wl[b, i, REUSE] * (1.0 - m) * lost


@_inline
def _rates(mach, wl, x, b, i, m, rho, lat):
    """(instructions/s, CPI, memory bytes per instruction) of workload ``i`` at miss ratio
    ``m`` and memory latency ``lat`` (ns): CPI = a + b * L, hits paying a share of the MBA
    delay; a bandwidth cap enforced over short windows makes the CPI at least the one that
    draws the cap while the workload runs."""
    apki = wl[b, i, APKI] * x[b, i, APKI_S]
    freq, hz = mach[b, FREQ], mach[b, HZ]
    fm = freq / wl[b, i, MLP] * apki / 1000.0
    miss_bpi = apki / 1000.0 * LINE * (1.0 + wl[b, i, WB]) * m
    delay = x[b, i, DELAY_NS]
    hit_delay = mach[b, HIT_SHARE] * delay
    cpi = (wl[b, i, CPI_BASE] * x[b, i, CPI_S] + fm * (m * delay + hit_delay * (1.0 - m))) + (
        fm * m
    ) * lat
    lc = wl[b, i, IS_LC] != 0.0
    cap = x[b, i, BW_CAP]
    if math.isfinite(cap):
        running = max(1.0, rho * wl[b, i, WORKERS]) if lc else x[b, i, CORES]
        cpi = (cpi**4.0 + (running * hz * miss_bpi / cap) ** 4.0) ** 0.25
    # A worker busy on I/O serves no instructions: k workers finish at most k / (cpu time
    # + io) requests per second.
    spent = cpi + wl[b, i, IO_S] * hz / max(wl[b, i, IPR], 1.0)
    k_cpu = x[b, i, ACTIVE] * (wl[b, i, WORKERS] if lc else x[b, i, CORES]) * hz
    ips = k_cpu / spent
    if lc:
        ips = min(ips, x[b, i, LAM] * wl[b, i, IPR] * x[b, i, ACTIVE])
    return ips, cpi, miss_bpi + wl[b, i, DMA]


@_inline
def _excess_demand(mach, wl, x, b, m, rho, u):
    """h(u): the node's memory demand at the latency of utilisation ``u``, over its peak,
    minus ``u`` (decreasing in ``u``); ``m`` holds the miss ratios of its own workloads."""
    lat = latency(mach, b, u)
    total = 0.0
    for i in range(m.shape[0]):
        ips, _, bpi = _rates(mach, wl, x, b, i, m[i], rho[i], lat)
        total += ips * bpi
    return total / mach[b, PEAK] - u


@_jit
def _utilization(mach, wl, x, b, m, rho, u0, tol):
    """The memory utilisation u in [0, U_MAX] at which the workloads' demand, at the latency
    it causes, equals it: the root lies between a guess and its image, so bracket there and
    refine with Illinois regula falsi (usually 1-3 evaluations from the last step's u)."""
    u0 = min(max(u0, 0.0), U_MAX)
    h0 = _excess_demand(mach, wl, x, b, m, rho, u0)
    if abs(h0) <= tol:
        return u0
    u1 = min(max(u0 + h0, 0.0), U_MAX)
    h1 = _excess_demand(mach, wl, x, b, m, rho, u1)
    if h0 > 0:
        lo, hlo, hi, hhi = u0, h0, u1, h1
    else:
        lo, hlo, hi, hhi = u1, h1, u0, h0
    if hlo < 0 or hhi > 0:  # clipped at an end: the whole range
        lo, hi = 0.0, U_MAX
        hlo = _excess_demand(mach, wl, x, b, m, rho, lo)
        hhi = _excess_demand(mach, wl, x, b, m, rho, hi)
    u, side = u1, 0
    for _ in range(60):
        if hhi >= 0:  # an end that already solves it (demand at the bound is on the line)
            return hi
        if hlo <= 0:
            return lo
        u = (lo * hhi - hi * hlo) / (hhi - hlo)
        hu = _excess_demand(mach, wl, x, b, m, rho, u)
        if abs(hu) <= tol or hi - lo < 1e-9:
            return u
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
    return u


@_jit
def workload_allocation(group_of, gmask, gmb, cbm, modes, max_bw, delays, W):
    """Each workload's (mask rows (N, n, W), ways, MBA delay ns, bandwidth cap bytes/s) on
    N nodes: a workload runs with the allocation of the group holding most of its threads
    (``group_of`` (N, n): that group's column of ``gmask`` and ``gmb`` (N, G); -1: the
    default group, every way of ``cbm`` and MB at its maximum; -2: padding). An MB value
    is a delay per L2->LLC request in percent mode (``delays`` (N, levels)); AMD's and
    MBps' limits are per group, so workloads sharing one share its cap."""
    N, n = group_of.shape
    G = gmask.shape[1]
    members = np.zeros((N, G + 2))  # the default group in column G, padding in G + 1
    for b in range(N):
        for i in range(n):
            g = group_of[b, i]
            members[b, g if g >= 0 else (G if g == -1 else G + 1)] += 1.0
    bits = np.zeros((N, n, W))
    nways = np.empty((N, n))
    delay = np.zeros((N, n))
    cap = np.full((N, n), np.inf)
    for b in range(N):
        mode = modes[b]
        for i in range(n):
            g = group_of[b, i]
            own = g >= 0
            mask = gmask[b, g] if own else cbm[b]
            count = 0.0
            for k in range(W):
                if (mask >> k) & 1:
                    bits[b, i, k] = 1.0
                    count += 1.0
            nways[b, i] = max(1.0, count)
            mb = gmb[b, g] if own else np.nan
            if np.isnan(mb):
                mb = max_bw[b]
            share = max(members[b, g if own else (G if g == -1 else G + 1)], 1.0)
            if mode == MBA_PERCENT:
                delay[b, i] = delays[b, int(mb)]
            elif mode == MBA_AMD:
                if mb < max_bw[b]:
                    cap[b, i] = max(mb, 0.2) * 0.125e9 / share
            elif mode == MBA_MBPS:
                cap[b, i] = mb * float(1 << 20) / share
    return bits, nways, delay, cap


@_jit
def hold_cap(mach, wl, nways, ws_s, W, rows):
    """Bytes of its footprint each workload of nodes ``rows`` (R, n) can hold in ``nways``
    (R, n) ways of a set-associative cache: its lines hash to sets like balls into bins
    (Poisson with mean ``footprint / way size`` per set) and a set keeps at most ``nways``
    of them, so ``way_bytes * E[min(K, nways)]`` = ``way_bytes * sum over i < nways of
    P(K > i)``. Near the footprint a few ways leave conflict misses; a partition much
    larger than the footprint holds all of it."""
    R, n = nways.shape
    log_fact = np.empty(W)  # log i!, i = 0..W-1
    acc = 0.0
    for k in range(W):
        acc += math.log(max(float(k), 1.0))
        log_fact[k] = acc
    out = np.empty((R, n))
    for r in range(R):
        b = rows[r]
        wb = mach[b, WAY_BYTES]
        for i in range(n):
            fp = wl[b, i, FP] * ws_s[r, i]
            lam = max(fp / wb, 1e-12)
            log_lam = math.log(lam)
            cdf = 0.0  # P(K <= k)
            expected = 0.0
            for k in range(W):
                if not k < nways[r, i]:  # the sum is over the mask's ways only
                    break
                cdf += math.exp(-lam + k * log_lam - log_fact[k])
                expected += min(max(1.0 - cdf, 0.0), 1.0)
            out[r, i] = min(wb * expected, fp)
    return out


# ---------------------------------------------------------------------- the operating point


@_jit
def solve(mach, wl, knees, x, occ, counts, dyn_u, dyn_rho, dyn_eta, tol, rows):
    """Rates at the fixed point of CPI <-> bandwidth <-> memory latency for the occupancy
    ``occ`` held now, for nodes ``rows`` (R,): (solution (SOLUTION_FIELDS, R, n), memory
    latency (R,), utilisation (R,)), in the order of ``rows``. Every other argument is
    the whole batch's, read at those rows (so a step of some nodes gathers nothing).
    ``dyn_u`` is the warm start; node ``b``'s workloads are its first ``counts[b]``, the
    rest pad the batch (no accesses, never active)."""
    R, n = rows.shape[0], occ.shape[1]
    out = np.zeros((SOLUTION_FIELDS, R, n))
    lat_out = np.empty(R)
    u_out = np.empty(R)
    m = np.empty(n)
    for r in range(R):
        b = rows[r]
        lat_out[r], u_out[r] = _solve_node(
            mach, wl, knees, x, b, occ[b], counts[b], dyn_u[b], dyn_rho[b], dyn_eta[b], tol,
            out[:, r], m,
        )  # fmt: skip
    return out, lat_out, u_out


@_jit
def _solve_node(mach, wl, knees, x, b, occ, k, u0, rho, eta, tol, out, m):
    """:func:`solve` of node ``b`` holding ``occ`` (n, W), its first ``k`` workloads its
    own, from the warm start ``u0`` with the queues ``rho`` and eviction rates ``eta``
    (n,) of before: writes the node's solution ``out`` (SOLUTION_FIELDS, n) (``m``:
    scratch of n) and returns (memory latency, utilisation)."""
    n, W = occ.shape
    for i in range(n):
        held = 0.0
        for j in range(W):
            held += occ[i, j]
        mi = _miss_ratio(wl, knees, b, i, held, x[b, i, WS_S])
        m[i] = mi + _cold_misses(wl, x, b, i, mi, rho[i], eta[i])
        out[CAPACITY, i] = held
    # padding draws no bandwidth: the fixed point is over the others
    u = _utilization(mach, wl, x, b, m[:k], rho[:k], u0, tol)
    lat = latency(mach, b, u)
    hz = mach[b, HZ]
    for i in range(n):
        ips, cpi, bpi = _rates(mach, wl, x, b, i, m[i], rho[i], lat)
        access = ips * (wl[b, i, APKI] * x[b, i, APKI_S]) / 1000.0
        out[IPS, i], out[CPI, i], out[MISS_RATIO, i] = ips, cpi, m[i]
        out[ACCESS_RATE, i], out[MISS_RATE, i] = access, access * m[i]
        out[MEM_BW, i] = ips * bpi
        if wl[b, i, IS_LC] != 0.0:
            service = wl[b, i, IPR] * cpi / hz + wl[b, i, IO_S]
            out[SERVICE_S, i] = service
            out[BUSY, i] = ips * cpi / hz
            out[RHO, i] = x[b, i, LAM] * x[b, i, ACTIVE] * service / wl[b, i, WORKERS]
        else:
            out[BUSY, i] = x[b, i, ACTIVE] * x[b, i, CORES]
    return lat, u


# ---------------------------------------------------------------------- occupancy


@_jit
def _step_occupancy(
    mach, wl, x, masks, b, occ, miss_rate, dt, migrate, hit_rate, lines, new, eta, ins, held
):  # fmt: skip
    """Occupancy ``new`` of node ``b`` after ``dt`` s with constant insertion from the start
    occupancy ``occ`` (n, W), each line's eviction rate by others into ``eta`` and the
    bytes each workload holds after it into ``held`` (``miss_rate`` is used up: lines
    migrating into a mask are added to it; ``ins``: (n, W) scratch).

    Free space fills first, then each inserted line evicts a line of the way chosen in
    proportion to occupancy. On a non-inclusive LLC (``migrate``), a line hit outside the
    workload's mask moves to its L2 and re-enters the LLC through the current mask:
    out-of-mask lines migrate into the mask at their hit rate. Its mask keeps at most
    ``hold_cap`` of its footprint (set conflicts), and a workload holds at most its
    footprint: its inserts replace its own lines in its mask first, then elsewhere."""
    n, W = occ.shape
    wb = mach[b, WAY_BYTES]
    mr = miss_rate
    for i in range(n):
        for j in range(W):
            new[i, j] = occ[i, j]
    if migrate:
        for i in range(n):
            share = 1.0 - math.exp(-(hit_rate[i] / lines[i]) * dt)
            moved = 0.0
            for j in range(W):
                if masks[b, i, j] == 0.0:
                    mv = occ[i, j] * share
                    new[i, j] = occ[i, j] - mv
                    moved += mv
            mr[i] += moved / (LINE * dt)
    for i in range(n):
        per_miss = LINE / x[b, i, NWAYS]
        for j in range(W):
            ins[i, j] = masks[b, i, j] * per_miss * mr[i]
    for j in range(W):
        rate = 0.0
        used = 0.0
        for i in range(n):
            rate += ins[i, j]
            used += new[i, j]
        inv = 1.0 / max(rate, 1e-30)
        free = max(wb - used, 0.0)
        t1 = min(free * inv, dt)  # time to fill the free space
        decay = math.exp(rate * (t1 - dt) / wb)  # 1 where the way never filled
        for i in range(n):
            ss = ins[i, j] * (wb * inv)  # split by insertion rate
            new[i, j] = (ins[i, j] * t1 + new[i, j] - ss) * decay + ss
        for i in range(n):  # eviction by others' inserts, (R_j - I_wj) / way bytes
            ins[i, j] = (rate - ins[i, j]) / wb
    for i in range(n):
        # Its mask keeps at most ``hold_cap`` of its footprint (set conflicts); lines it
        # still holds outside the mask (a mask that shrank) are not limited by the mask.
        held_in = 0.0
        for j in range(W):
            held_in += new[i, j] * masks[b, i, j]
        cap = x[b, i, HOLD_CAP]
        if held_in > cap:
            cut = 1.0 - cap / max(held_in, 1e-30)
            for j in range(W):
                new[i, j] -= new[i, j] * masks[b, i, j] * cut
        tot = 0.0
        for j in range(W):
            tot += new[i, j]
        # A workload holds at most its footprint: its inserts replace its own lines in the
        # ways it inserts into first (LRU within the mask), then elsewhere.
        excess = tot - wl[b, i, FP] * x[b, i, WS_S]
        if excess > 0:
            held_in = 0.0
            for j in range(W):
                held_in += new[i, j] * masks[b, i, j]
            take = max(min(excess, held_in), 0.0)
            scale_in = take / max(held_in, 1e-30) if held_in > 0 else 0.0
            for j in range(W):
                new[i, j] -= new[i, j] * masks[b, i, j] * scale_in
            rest = max(excess - take, 0.0)
            if rest > 0:
                now = 0.0
                for j in range(W):
                    now += new[i, j]
                shrink = (now - rest) / max(now, 1e-30)
                for j in range(W):
                    new[i, j] *= shrink
            tot = 0.0
            for j in range(W):
                tot += new[i, j]
        evict = 0.0
        for j in range(W):
            evict += new[i, j] * ins[i, j]
        eta[i] = evict / max(tot, 1e-30)
        held[i] = tot


@_inline
def _end_miss_ratio(
    mach, wl, knees, x, masks, b, occ, m, access, dt, migrate, lines, dyn_rho, scratch
):
    """One evaluation of the backward-Euler step: insert at miss ratio ``m`` and access rate
    ``access`` over ``dt``, and the miss ratio ``end`` the occupancy it leaves gives
    (``scratch``: the occupancy ``new``, eviction rates ``eta``, ``end``, and room for
    the step's per-way inserts and (miss rate, hit rate, bytes held) per workload)."""
    new, eta, end, ins, rates = scratch
    n = occ.shape[0]
    miss_rate, hit_rate, held = rates[0], rates[1], rates[2]
    for i in range(n):
        miss_rate[i] = access[i] * m[i]
        hit_rate[i] = access[i] * (1.0 - m[i])
    _step_occupancy(
        mach, wl, x, masks, b, occ, miss_rate, dt, migrate, hit_rate, lines, new, eta, ins, held
    )
    for i in range(n):
        e = _miss_ratio(wl, knees, b, i, held[i], x[b, i, WS_S])
        # Idle-gap evictions at the step end's rates, too.
        end[i] = e + _cold_misses(wl, x, b, i, e, dyn_rho[i], eta[i])


@_jit
def _migrates(mach, masks, b, occ) -> bool:
    """Whether lines held outside the masks migrate into them over node ``b``'s step: on a
    non-inclusive LLC, when a workload holds more than a line outside its mask (read from
    the start occupancy ``occ``, once per step)."""
    if mach[b, NON_INCLUSIVE] == 0.0:
        return False
    n, W = occ.shape
    for i in range(n):
        for j in range(W):
            if masks[b, i, j] == 0.0 and occ[i, j] > LINE:
                return True
    return False


@_inline
def _keep(new, eta, m, out_occ, out_eta, out_m):
    """A node's result so far (into its rows of the outputs): the occupancy, eviction
    rates and miss ratio of its latest evaluation."""
    n, W = new.shape
    for i in range(n):
        for j in range(W):
            out_occ[i, j] = new[i, j]
        out_eta[i] = eta[i]
        out_m[i] = m[i]


@_inline
def _access_at(mach, wl, x, b, m, rho, lat, out):
    """LLC accesses/s of each workload of node ``b`` at miss ratios ``m``, latency ``lat``."""
    for i in range(m.shape[0]):
        ips = _rates(mach, wl, x, b, i, m[i], rho[i], lat)[0]
        out[i] = ips * (wl[b, i, APKI] * x[b, i, APKI_S]) / 1000.0


@_inline
def _evaluate(mach, wl, knees, x, masks, b, o, m, access, step, scratch, out):
    """Node ``b``'s step evaluated at miss ratio ``m`` and access rates ``access``:
    ``scratch`` (occupancy, eviction rates, end miss ratio) holds the result, which
    becomes the node's in ``out`` (its occupancy (n, W), eviction rates and miss ratio
    (n,), and its count of evaluations (1,))."""
    dt, migrate, lines, rho = step
    new, eta = scratch[0], scratch[1]
    out_occ, out_eta, out_m, evaluations = out
    evaluations[0] += 1
    _end_miss_ratio(mach, wl, knees, x, masks, b, o, m, access, dt, migrate, lines, rho, scratch)
    _keep(new, eta, m, out_occ, out_eta, out_m)


@_jit
def advance(
    mach, wl, knees, x, masks, occ, counts, sol_m, sol_access, sol_lat, dyn_rho, dt, guess,
    iters, tol, rows
):  # fmt: skip
    """For nodes ``rows`` (R,): occupancy (R, n, W), eviction rates (R, n), the miss ratio
    each workload converged to (R, n) and the occupancy evaluations each node made (R,)
    after ``dt[r]`` s per node, with insertion at the miss ratio *and access rate* of the
    step's end (backward Euler), at the step's memory latency ``sol_lat``. The step's
    solution (``sol_m``, ``sol_access``, ``sol_lat``), ``dt`` and ``guess`` are the R
    nodes' own, in the order of ``rows``; every other argument is the whole batch's, read
    at those rows.

    r(m) = m_end(m) - m falls as m rises (more misses fill more, and a fuller cache misses
    less), so its root lies between the start's miss ratio and the end's that it gives:
    bracket it there, per workload, and close in by Illinois regula falsi. A node is done
    when each workload is within ``tol`` or its bracket has closed (the root beyond both
    ends: the secant point is clipped to the bracket's end and cannot move). The first
    point is the start's miss ratio plus ``guess`` (the correction the node's previous
    step needed; zeros: none).

    Node ``b``'s workloads are its first ``counts[b]``; the rest pad the batch (no
    accesses: they hold nothing and keep their miss ratio), so the solve skips them."""
    R, n, W = rows.shape[0], occ.shape[1], occ.shape[2]
    out_occ = np.empty((R, n, W))
    out_eta = np.zeros((R, n))
    out_m = np.empty((R, n))
    evaluations = np.zeros(R, dtype=np.int64)
    scratch, work = _node_scratch(n, W)
    for r in range(R):
        b = rows[r]
        k = counts[b]
        for i in range(k, n):
            for j in range(W):
                out_occ[r, i, j] = occ[b, i, j]
            out_m[r, i] = sol_m[r, i]
        out = (out_occ[r], out_eta[r], out_m[r], evaluations[r : r + 1])
        _advance_node(mach, wl, knees, x, masks, b, occ[b, :k], sol_m[r, :k],
                      sol_access[r, :k], sol_lat[r], dyn_rho[b, :k], dt[r], guess[r, :k],
                      iters, tol, scratch, work[:, :k], out)  # fmt: skip
    return out_occ, out_eta, out_m, evaluations


@_jit
def _node_scratch(n, W):
    """Scratch for :func:`_advance_node` of nodes of up to ``n`` workloads and ``W`` ways:
    (its ``buffers``, its ``work``), reused node after node."""
    buffers = (np.empty((n, W)), np.empty(n), np.empty(n), np.empty((n, W)), np.empty((3, n)))
    return buffers, np.empty((11, n))


@_jit
def _advance_node(
    mach, wl, knees, x, masks, b, o, sol_m, sol_access, lat, rho, dt, guess, iters, tol,
    buffers, work, out
):  # fmt: skip
    """:func:`advance` of node ``b``, whose own workloads' start occupancy is ``o``
    (n, W) and whose rows of the other per-workload arrays are given (``buffers`` and
    ``work``: scratch of at least n rows; ``out``: the node's outputs, as
    :func:`_evaluate` writes them)."""
    n, W = o.shape
    new, eta, end = buffers[0][:n], buffers[1][:n], buffers[2][:n]
    scratch = (new, eta, end, buffers[3][:n], buffers[4][:, :n])
    a, last, m, ra, access, lines, lo, rlo, hi, rhi, side = (
        work[0], work[1], work[2], work[3], work[4], work[5], work[6], work[7], work[8],
        work[9], work[10],
    )  # fmt: skip
    migrate = _migrates(mach, masks, b, o)
    if migrate:
        for i in range(n):
            held = 0.0
            for j in range(W):
                held += o[i, j]
            lines[i] = max(held, LINE) / LINE
    step = (dt, migrate, lines, rho)
    guessed = False
    for i in range(n):
        if guess[i] != 0.0:
            guessed = True
    if guessed:
        for i in range(n):
            a[i] = min(max(sol_m[i] + guess[i], 0.0), 1.0)
        _access_at(mach, wl, x, b, a, rho, lat, access)
    else:
        for i in range(n):
            a[i], access[i] = sol_m[i], sol_access[i]
    _evaluate(mach, wl, knees, x, masks, b, o, a, access, step, scratch, out)
    live = False
    for i in range(n):
        if not abs(end[i] - a[i]) < tol:
            live = True
    if not live:
        return
    for i in range(n):
        ra[i] = end[i] - a[i]
        last[i] = end[i]
    _access_at(mach, wl, x, b, last, rho, lat, access)
    _evaluate(mach, wl, knees, x, masks, b, o, last, access, step, scratch, out)
    for i in range(n):
        rb = end[i] - last[i]
        # lo: r > 0 (too few misses), hi: r < 0 (too many); the last two bracket.
        if ra[i] > 0:
            lo[i], rlo[i], hi[i], rhi[i] = a[i], ra[i], last[i], rb
        else:
            lo[i], rlo[i], hi[i], rhi[i] = last[i], rb, a[i], ra[i]
        side[i] = 0.0
    for _ in range(iters):
        done = True
        for i in range(n):
            if not (abs(end[i] - last[i]) < tol or lo[i] == hi[i]):
                done = False
        if done:
            break
        for i in range(n):
            denom = rlo[i] - rhi[i]
            # The secant point where the bracket's residuals differ (lo elsewhere).
            mi = (lo[i] * -rhi[i] + hi[i] * rlo[i]) / denom if denom > 1e-15 else lo[i]
            m[i] = min(max(mi, min(lo[i], hi[i])), max(lo[i], hi[i]))
        _access_at(mach, wl, x, b, m, rho, lat, access)
        _evaluate(mach, wl, knees, x, masks, b, o, m, access, step, scratch, out)
        for i in range(n):
            r = end[i] - m[i]
            # Illinois: an end kept twice in a row has its residual halved.
            if r > 0:
                if side[i] == 1.0:
                    rhi[i] *= 0.5
                lo[i], rlo[i] = m[i], r
                side[i] = 1.0
            else:
                if side[i] == -1.0:
                    rlo[i] *= 0.5
                hi[i], rhi[i] = m[i], r
                side[i] = -1.0
            last[i] = m[i]


# ---------------------------------------------------------------------- steady state


@_jit
def steady(mach, wl, knees, x, masks, occ, counts, tol, big_move, iters):
    """The converged occupancy (B, n, W), solution (SOLUTION_FIELDS, B, n), memory latency
    (B,), utilisation (B,) and eviction rates (B, n) of each node for constant inputs,
    from the occupancy ``occ``, and the iterations each node took (B,; ``iters`` + 1: it
    ran out). :meth:`agent.sim.model.Model.steady` says what each step does and why;
    here each node runs its loop to the end on its own, in the same arithmetic as the
    steps :func:`solve` and :func:`advance` take one call at a time. ``tol`` and
    ``big_move`` (B,) are each node's convergence test and "a big move" in bytes."""
    B, n, W = occ.shape
    sol = np.zeros((SOLUTION_FIELDS, B, n))
    lat_out, u_out = np.empty(B), np.empty(B)
    out_occ = occ.copy()
    out_eta = np.zeros((B, n))
    taken = np.empty(B, dtype=np.int64)
    # one node's outputs of advance, and its scratch, as advance holds them
    step_out = (np.empty((n, W)), np.zeros(n), np.empty(n), np.zeros(1, np.int64))
    scratch, work = _node_scratch(n, W)
    m, rho, no_guess = np.empty(n), np.empty(n), np.zeros(n)
    for b in range(B):
        k = counts[b]
        o, eta = out_occ[b], out_eta[b]
        for i in range(n):
            rho[i] = 0.0
        lat, u = _solve_node(mach, wl, knees, x, b, o, k, 0.0, rho, eta, 1e-6, sol[:, b], m)
        dt = 0.1
        taken[b] = iters + 1
        for it in range(iters):
            for i in range(n):
                rho[i] = sol[RHO, b, i]
            _advance_node(mach, wl, knees, x, masks, b, o[:k], sol[MISS_RATIO, b, :k],
                          sol[ACCESS_RATE, b, :k], lat, rho[:k], dt, no_guess[:k], 5, 2e-5,
                          scratch, work[:, :k], step_out)  # fmt: skip
            new = step_out[0]
            moved = 0.0
            for i in range(k):  # padding rows keep what they hold: they never move
                for j in range(W):
                    d = abs(new[i, j] - o[i, j])
                    if d > moved or d != d:  # NaN propagates, as numpy's max does
                        moved = d
            # Long steps jump to each step's equilibrium; halving the jump damps the
            # feedback through the rates (it changes the path, not the fixed point).
            for i in range(k):
                for j in range(W):
                    o[i, j] = new[i, j] if dt < 1.0 else 0.5 * (o[i, j] + new[i, j])
            for i in range(k):
                eta[i] = step_out[1][i]
            lat, u = _solve_node(mach, wl, knees, x, b, o, k, u, rho, eta, 1e-10, sol[:, b], m)
            if moved < tol[b]:
                taken[b] = it + 1
                break
            dt = max(dt * 0.5, 0.1) if moved > big_move[b] else min(dt * 1.5, 100.0)
        lat_out[b], u_out[b] = lat, u
    return out_occ, sol, lat_out, u_out, out_eta, taken

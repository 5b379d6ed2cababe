"""The performance model of the simulated node, vectorised over nodes and workload instances.

Implements effects 1-5 and 7 of the simulated node (equations in docs/SIMULATOR.md). Every
array has a leading *node* axis, so one call steps many independent nodes (a batch for
training) as cheaply as one; :class:`agent.sim.node.SimNode` is a batch of one.

1. miss-ratio curves ``m(c)`` that reach their floor when the whole footprint is held;
2. CAT semantics: a workload inserts only into its mask's ways and hits on any line it
   holds; a way's occupancy splits by insertion rate; set-associativity limits how much of
   a footprint a mask of ``n`` ways can hold (lines hash to sets as balls into bins);
3. inertia: occupancy per (workload, way) follows the exact fill/replace dynamics over a
   step; lines an LC service leaves in shared ways are evicted while it idles between
   request bursts, and the next request pays for its cross-request reuse (Ubik Sec. 3.4);
4. memory bandwidth contention: one memory latency per node rising along a loaded-latency
   curve with the utilisation of the peak, solved as a fixed point with every workload's
   CPI, so a squeezed streaming neighbour slows everyone;
5. bandwidth limits reach CPI, hence LC service time: Intel MBA levels add a per-request
   delay to L2->LLC traffic (hits pay a share); AMD limits cap the bandwidth a group draws
   *while it runs* (enforced over sub-millisecond windows), which throttles an LC
   service's requests even when its average bandwidth is far below the cap;
7. CPI -> instructions/s for batch jobs (with phases); LC services are demand-driven.

No per-request work happens here (LC latency is read from tables: :mod:`agent.sim.latency`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.sim.catalog import MachinePreset, WorkloadSpec

LINE = 64.0
U_MAX = 1.0 - 1e-7  # the queue term diverges there: demand can never exceed the peak


@dataclass
class Inputs:
    """Per-workload inputs of one solve: arrays (nodes, workloads), masks (nodes,
    workloads, ways). Padding workloads are inactive; padding ways are in no mask."""

    masks: np.ndarray  # 0/1: ways the workload may insert into
    nways: np.ndarray  # ways in that mask (>= 1)
    delay_ns: np.ndarray  # Intel MBA delay per L2->LLC request
    bw_cap: np.ndarray  # bytes/s a workload may draw while running (inf: none)
    active: np.ndarray  # 0/1
    apki_s: np.ndarray  # phase multipliers
    ws_s: np.ndarray
    cpi_s: np.ndarray
    lam: np.ndarray  # LC request rate (req/s); 0 for batch
    cores: np.ndarray  # cores the workload runs on (after oversubscription)
    hold_cap: np.ndarray | None = None  # bytes its mask can hold of its footprint (lazily)
    unmask: np.ndarray | None = None  # 1 - masks (lazily)
    ins_per_miss: np.ndarray | None = None  # bytes inserted per (miss, way) (lazily)
    cpu_fixed: tuple | None = None  # the CPI model's parts that do not depend on misses

    def take(self, idx: np.ndarray) -> Inputs:
        """The inputs of nodes ``idx`` (lazily computed parts included)."""
        return Inputs(
            *(getattr(self, f)[idx] for f in _INPUT_ARRAYS),
            hold_cap=_rows(self.hold_cap, idx),
            unmask=_rows(self.unmask, idx),
            ins_per_miss=_rows(self.ins_per_miss, idx),
            cpu_fixed=None
            if self.cpu_fixed is None
            else tuple(_rows(x, idx) for x in self.cpu_fixed),
        )


@dataclass
class Solution:
    """Per-workload rates at one operating point (arrays (nodes, workloads))."""

    ips: np.ndarray
    cpi: np.ndarray
    miss_ratio: np.ndarray
    access_rate: np.ndarray  # LLC references/s
    miss_rate: np.ndarray  # LLC misses/s
    mem_bw: np.ndarray  # bytes/s (misses x 64 x (1 + write-back))
    capacity: np.ndarray  # bytes held
    service_s: np.ndarray  # LC mean service time (s); 0 for batch
    busy: np.ndarray  # busy cores (LC: utilisation x workers)
    rho: np.ndarray  # LC per-worker utilisation (offered load x service time / workers)
    latency_ns: np.ndarray  # (nodes,) memory latency
    utilization: np.ndarray  # (nodes,) memory bandwidth utilisation of the peak

    def take(self, idx: np.ndarray) -> Solution:
        return Solution(*(x[idx] for x in self.__dict__.values()))

    def put(self, idx: np.ndarray, sub: Solution) -> None:
        """Write ``sub``'s nodes into rows ``idx``."""
        for k, v in self.__dict__.items():
            v[idx] = getattr(sub, k)


@dataclass
class Dynamics:
    """What carries over from one step to the next besides occupancy."""

    u: np.ndarray  # (nodes,) memory utilisation (the fixed point's warm start)
    rho: np.ndarray  # (nodes, workloads) LC utilisation of the last step
    eta: np.ndarray  # (nodes, workloads) rate (1/s) at which others evict a line it holds

    def take(self, idx: np.ndarray) -> Dynamics:
        return Dynamics(self.u[idx], self.rho[idx], self.eta[idx])


@dataclass
class _Cpu:
    """CPI = a + b * L (capped workloads: at least the throttle's), instructions/s from it."""

    a: np.ndarray
    b: np.ndarray
    k_cpu: np.ndarray  # cycles/s of the cores (LC: of its workers)
    demand: np.ndarray  # LC: instructions/s its requests ask for (inf for batch)
    throttle: np.ndarray | None  # (CPI that draws the cap)^4 of the capped entries
    capped: np.ndarray | None  # (nodes, workloads) which are capped
    io_cpi: np.ndarray | None  # I/O time per instruction, in cycles
    bpi: np.ndarray
    apki: np.ndarray

    def rates(self, lat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(instructions/s, CPI) at memory latency ``lat`` (ns, one per node)."""
        cpi = self.a + self.b * lat[:, None]
        if self.throttle is not None:  # general powers are slow: only where capped
            cpi[self.capped] = (cpi[self.capped] ** 4 + self.throttle) ** 0.25
        spent = cpi if self.io_cpi is None else cpi + self.io_cpi
        return np.minimum(self.k_cpu / spent, self.demand), cpi


_INPUT_ARRAYS = (
    "masks",
    "nways",
    "delay_ns",
    "bw_cap",
    "active",
    "apki_s",
    "ws_s",
    "cpi_s",
    "lam",
    "cores",
)


def _ways(x: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
    """Sum over the last (ways) axis of (B, n, W) arrays: of ``x``, or of ``x * y``
    (``add.reduce`` is what ``sum`` calls, without its Python wrapper)."""
    return np.add.reduce(x if y is None else x * y, axis=-1)


def _workloads(x: np.ndarray) -> np.ndarray:
    """Sum over the workloads axis of a (B, n, W) array -> (B, 1, W). A reduction over a
    middle axis adds the rows in order, as einsum's "bnw->bw" does (bit for bit): at a few
    nodes without einsum's parsing, which costs more than the sum; on a batch by einsum,
    whose loop is 2-4x faster than the reduction's at 256 nodes and more."""
    if x.size <= 1024:
        return np.add.reduce(x, axis=1, keepdims=True)
    return np.einsum("bnw->bw", x)[:, None, :]


def _out_rows(out: tuple | None, idx: np.ndarray) -> tuple | None:
    """Rows ``idx`` of :meth:`Model._outside`'s result."""
    return None if out is None else tuple(None if x is None else x[idx] for x in out)


def _rows(x, idx):
    return None if x is None else x[idx]


def _worth_dropping(live: np.ndarray) -> bool:
    """Whether to gather the nodes still iterating into smaller arrays: when at most half
    remain, and not for a handful of rows, where a step costs no more than the gather."""
    n = len(live)
    return n > 8 and 2 * int(live.sum()) <= n


def _pad(rows: Sequence[Sequence[float]], n: int, fill: float) -> np.ndarray:
    return np.array([list(r) + [fill] * (n - len(r)) for r in rows], dtype=float)


class Model:
    """Constant parameters of ``len(presets)`` nodes and the solver; state (occupancy,
    :class:`Dynamics`) is passed in and out so callers can evaluate counterfactuals.

    Args:
        presets: the machine of each node.
        specs: each node's workload instances (their catalog entries).
        threads: each instance's threads (= pids = cores used).
        n, W, knees: pad to this many workloads, ways and MRC knees (default: the most
            any node has), so that nodes can later be replaced (:meth:`put`) by others
            of the same sizes.
    """

    def __init__(
        self,
        presets: Sequence[MachinePreset],
        specs: Sequence[Sequence[WorkloadSpec]],
        threads: Sequence[Sequence[int]],
        *,
        n: int | None = None,
        W: int | None = None,
        knees: int | None = None,
    ) -> None:
        if not (len(presets) == len(specs) == len(threads)) or not presets:
            raise ValueError("one preset, workload list and thread list per node")
        self.presets = list(presets)
        self.specs = [list(s) for s in specs]
        self.B = len(presets)
        most = max([len(s) for s in specs] + [1])
        widest = max(p.ways for p in presets)
        if (n is not None and n < most) or (W is not None and widest > W):
            raise ValueError(
                f"padding to {n} workloads and {W} ways is less than a node has "
                f"({most} workloads, {widest} ways)"
            )
        self.n = n or most
        self.W = W or widest
        n, W = self.n, self.W
        col = lambda f: np.array([f(p) for p in presets], dtype=float)[:, None]  # noqa: E731
        self.ways = col(lambda p: p.ways)
        self.way_bytes = col(lambda p: p.way_bytes)
        self.freq = col(lambda p: p.freq_ghz)  # cycles per ns
        self.hz = self.freq * 1e9
        self.L0 = col(lambda p: p.mem_latency_ns)[:, 0]
        self.lat_slope = col(lambda p: p.latency_slope)[:, 0]
        self.lat_queue = col(lambda p: p.latency_queue)[:, 0]
        self.hit_share = col(lambda p: p.mba_hit_share)
        self.peak = col(lambda p: p.peak_bw_bps)[:, 0]
        self.non_inclusive = np.array([not p.llc_inclusive for p in presets])
        self.way_valid = np.arange(W)[None, :] < self.ways  # (B, W)

        def per(f, fill=0.0):
            return _pad([[f(s) for s in row] for row in self.specs], n, fill)

        self.valid = per(lambda s: 1.0) > 0
        self.threads = _pad(threads, n, 1.0)
        self.cpi_base = per(lambda s: s.cpi_base, 1.0)
        self.apki = per(lambda s: s.apki)
        self.mlp = per(lambda s: s.mlp, 1.0)
        self.wb = per(lambda s: s.writeback)
        self.fp = per(lambda s: s.footprint_bytes, LINE)
        self.floor = per(lambda s: s.mrc_floor)
        self.span = per(lambda s: s.mrc_ceil - s.mrc_floor)
        k = max([len(s.knees) for row in self.specs for s in row] + [1])
        if knees is not None:
            if knees < k:
                raise ValueError(f"padding to {knees} knees; a workload has {k}")
            k = knees
        self.kw = np.zeros((self.B, n, k))
        self.kr = np.full((self.B, n, k), 0.5)  # knee position as a fraction of the footprint
        self.ks = np.ones((self.B, n, k))
        for b, row in enumerate(self.specs):
            for i, s in enumerate(row):
                for j, (w, size, sh) in enumerate(s.knees):
                    self.kw[b, i, j] = w
                    self.kr[b, i, j] = size / s.footprint_bytes
                    self.ks[b, i, j] = sh
        self.kend = 1.0 / (1.0 + (1.0 / self.kr) ** self.ks)  # the knee term's value at c = F
        self.is_lc = per(lambda s: float(s.kind == "lc")) > 0
        self.ipr = per(lambda s: s.lc.instructions_per_request if s.lc else 0.0)
        self.burst = per(lambda s: s.lc.burst if s.lc else 1.0, 1.0)
        self.reuse = per(lambda s: s.lc.reuse if s.lc else 0.0)
        self.io_s = per(lambda s: s.lc.io_ms * 1e-3 if s.lc else 0.0)
        # DMA bytes per instruction of the request (0 for batch jobs).
        self.dma = per(lambda s: s.lc.io_bytes / s.lc.instructions_per_request if s.lc else 0.0)
        workers = per(lambda s: s.lc.workers if s.lc else 1.0, 1.0)
        self.workers = np.where(self.is_lc, np.minimum(workers, self.threads), 1.0)
        # Every parameter above is an array over nodes: take() and put() move their rows.
        self._node_arrays = tuple(k for k, v in vars(self).items() if isinstance(v, np.ndarray))

    # ------------------------------------------------------------------ nodes

    @property
    def knees(self) -> int:
        return self.kw.shape[-1]

    def take(self, idx: np.ndarray) -> Model:
        """The model of nodes ``idx`` alone (same padding). Every equation is per node, so
        a node's results do not depend on which other nodes share its batch. Parameter
        rows are gathered when first used (a step uses a third of them)."""
        idx = np.asarray(idx)
        root = self.__dict__.get("_root", self)
        if root is not self:
            idx = self._rows_of[idx]
        sub = object.__new__(_Rows)
        sub.__dict__.update({k: v for k, v in vars(root).items() if k not in root._node_arrays})
        sub._root, sub._rows_of = root, idx
        sub.presets = [root.presets[i] for i in idx]
        sub.specs = [root.specs[i] for i in idx]
        sub.B = len(idx)
        return sub

    def put(self, idx: Sequence[int], other: Model) -> None:
        """Replace nodes ``idx`` by ``other``'s nodes (built with the same padding)."""
        if (other.n, other.W, other.knees) != (self.n, self.W, self.knees):
            raise ValueError(
                f"model padded to {(other.n, other.W, other.knees)} workloads, ways and knees; "
                f"this one to {(self.n, self.W, self.knees)}"
            )
        for k in self._node_arrays:
            getattr(self, k)[idx] = getattr(other, k)
        for j, i in enumerate(idx):
            self.presets[i] = other.presets[j]
            self.specs[i] = other.specs[j]

    # ------------------------------------------------------------------ pieces

    def latency(self, u: np.ndarray) -> np.ndarray:
        """Loaded memory latency (ns) at utilisation ``u`` of each node's peak."""
        u = np.minimum(np.maximum(u, 0.0), U_MAX)
        return self.L0 * (1.0 + self.lat_slope * u + self.lat_queue * u / (1.0 - u))

    def miss_ratio(self, held: np.ndarray, ws_s: np.ndarray) -> np.ndarray:
        """m(c): ``held`` bytes of a footprint scaled by ``ws_s`` (floor at the footprint)."""
        x = np.minimum(held / (self.fp * ws_s), 1.0)[..., None]  # held >= 0
        g = (1.0 / (1.0 + (x / self.kr) ** self.ks) - self.kend) / (1.0 - self.kend)
        return self.floor + self.span * _ways(self.kw, g)

    def hold_cap(self, nways: np.ndarray, ws_s: np.ndarray) -> np.ndarray:
        """Bytes of its footprint a workload can hold in ``nways`` ways of a set-associative
        cache: its lines hash to sets like balls into bins (Poisson with mean
        ``footprint / way size`` per set) and a set keeps at most ``nways`` of them, so
        ``way_bytes * E[min(K, nways)]``. Near the footprint a few ways leave conflict
        misses; a partition much larger than the footprint holds all of it."""
        lam = np.maximum(self.fp * ws_s / self.way_bytes, 1e-12)
        i = np.arange(self.W, dtype=float)
        # log P(K = i), i = 0..W-1; then P(K > i) = 1 - cumulative sum.
        logp = -lam[..., None] + i * np.log(lam)[..., None] - np.cumsum(np.log(np.maximum(i, 1.0)))
        tail = 1.0 - np.cumsum(np.exp(logp), axis=-1)
        within = i < nways[..., None]
        expected = (np.clip(tail, 0.0, 1.0) * within).sum(axis=-1)
        return np.minimum(self.way_bytes * expected, self.fp * ws_s)

    def cold_misses(self, m: np.ndarray, inp: Inputs, dyn: Dynamics) -> np.ndarray:
        """Extra miss ratio of an LC service from lines evicted while it idled.

        Bursts of requests arrive at ``lam / burst``; a burst that finds every worker idle
        (probability ``(1 - rho)^workers``) follows an idle gap ~ Exp(lam / burst), during
        which a line it holds is evicted at rate ``eta`` (others' insertions into its ways).
        Its first request re-misses the lost share of its cross-request reuse."""
        lam = inp.lam * inp.active
        idle = np.maximum(1.0 - dyn.rho, 0.0) ** self.workers
        lost = np.where(
            self.is_lc & (lam > 0), idle * dyn.eta / (self.burst * dyn.eta + lam + 1e-30), 0.0
        )
        return self.reuse * (1.0 - m) * lost

    # ------------------------------------------------------------------ the operating point

    def _cpu(self, inp: Inputs, m: np.ndarray, dyn: Dynamics) -> _Cpu:
        """How instructions/s and CPI follow the memory latency at miss ratio ``m``."""
        fixed = inp.cpu_fixed
        if fixed is None:
            # What does not depend on the miss ratio, once per set of inputs.
            apki = self.apki * inp.apki_s
            lc = self.is_lc
            io = self.io_s
            capped = np.isfinite(inp.bw_cap)
            fixed = inp.cpu_fixed = (
                apki,
                self.freq / self.mlp * apki / 1000.0,  # fm
                apki / 1000.0 * LINE * (1.0 + self.wb),  # miss bytes per instruction / m
                self.cpi_base * inp.cpi_s,
                self.hit_share * inp.delay_ns,
                inp.active * np.where(lc, self.workers, inp.cores) * self.hz,  # k_cpu
                np.where(lc, inp.lam * self.ipr * inp.active, np.inf),  # LC demand
                # A worker busy on I/O serves no instructions: k workers finish at most
                # k / (cpu time + io) requests per second.
                io * self.hz / np.maximum(self.ipr, 1.0) if (io > 0).any() else None,
                capped if capped.any() else None,
                np.where(capped, inp.bw_cap, 1.0),
            )
        apki, fm, bytes_per_miss, base, hit_delay, k_cpu, demand, io_cpi, capped, cap = fixed
        miss_bpi = bytes_per_miss * m  # miss traffic per instruction
        throttle = None
        if capped is not None:
            # While running, a workload on k cores draws k * hz / cpi * bpi bytes/s; a cap
            # enforced over short windows makes the CPI at least the one that draws the cap.
            running = np.where(self.is_lc, np.maximum(1.0, dyn.rho * self.workers), inp.cores)
            throttle = (running * self.hz * miss_bpi / cap)[capped] ** 4
        return _Cpu(
            # cpi = a + b * L   (L in ns); hits pay a share of the MBA delay too.
            a=base + fm * (m * inp.delay_ns + hit_delay * (1.0 - m)),
            b=fm * m,
            k_cpu=k_cpu,
            demand=demand,
            throttle=throttle,
            capped=capped,
            io_cpi=io_cpi,
            bpi=miss_bpi + self.dma,  # memory bytes per instruction, DMA of requests included
            apki=apki,
        )

    def solve(self, inp: Inputs, occ: np.ndarray, dyn: Dynamics, tol: float = 1e-6) -> Solution:
        """Rates at the fixed point of CPI <-> bandwidth <-> memory latency, for the
        occupancy ``occ`` held now (``dyn.u`` is the warm start)."""
        held = _ways(occ)
        m = self.miss_ratio(held, inp.ws_s)
        m = m + self.cold_misses(m, inp, dyn)
        cpu = self._cpu(inp, m, dyn)
        u, lat, ips, cpi = self._utilization(cpu, dyn.u, tol)
        access = ips * cpu.apki / 1000.0
        lc = self.is_lc
        service = np.where(lc, self.ipr * cpi / self.hz + self.io_s, 0.0)
        busy = np.where(lc, ips * cpi / self.hz, inp.active * inp.cores)
        rho = np.where(lc, inp.lam * inp.active * service / self.workers, 0.0)
        return Solution(
            ips, cpi, m, access, access * m, ips * cpu.bpi, held, service, busy, rho, lat, u
        )

    def _utilization(self, cpu: _Cpu, guess: np.ndarray, tol: float = 1e-6) -> tuple:
        """The memory utilisation at which the workloads' demand, at the latency it causes,
        equals it (per node), and the memory latency, instructions/s and CPI there."""
        L_of, peak, bpi = self.latency, self.peak, cpu.bpi
        seen: dict[bytes, tuple] = {}  # u -> (latency, ips, cpi): the root is one of them

        def h(u: np.ndarray):
            lat = L_of(u)
            ips, cpi = cpu.rates(lat)
            seen[u.tobytes()] = (lat, ips, cpi)
            return ((ips * bpi).sum(axis=-1) / peak - u,)

        u = _fixed_point(h, guess, tol)
        got = seen.get(u.tobytes())
        if got is None:  # a root assembled from several evaluations (nodes apart)
            lat = L_of(u)
            return (u, lat, *cpu.rates(lat))
        return (u, *got)

    # ------------------------------------------------------------------ occupancy

    def _step_occupancy(
        self,
        occ: np.ndarray,
        inp: Inputs,
        miss_rate: np.ndarray,
        dt: float | np.ndarray,
        hit_rate: np.ndarray | None = None,
        held_out: tuple | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(occupancy after ``dt`` s with constant insertion, each line's eviction rate by
        others, the bytes each workload holds after it: the solver needs them, and this runs
        several times per step). Free space fills first, then each inserted line evicts a
        line of the way chosen in proportion to occupancy. ``dt`` is one step for every node
        or (nodes, 1).

        On a non-inclusive LLC (``hit_rate`` given), a line hit outside the workload's
        mask moves to its L2 and re-enters the LLC on L2 eviction through the current
        mask: out-of-mask lines migrate into the mask at their hit rate.

        Sums over workloads add the rows in order (:func:`_workloads`); sums over ways stay
        ``sum``'s pairwise order, since a last-bit change there moves the golden
        trajectories by up to 1e-4 through the solver's iterations. ``held_out``:
        :meth:`_outside` of ``occ``, when the caller steps the same start occupancy several
        times."""
        wb = self.way_bytes[:, :, None]  # (B, 1, 1)
        dt_w = dt[..., None] if isinstance(dt, np.ndarray) and dt.ndim else dt  # vs (B, ., W)
        if inp.hold_cap is None:
            inp.hold_cap = self.hold_cap(inp.nways, inp.ws_s)
        if hit_rate is not None and (held_out is not None or self.non_inclusive.any()):
            outside, migrates, lines = self._outside(occ, inp) if held_out is None else held_out
            if lines is not None:
                share = 1.0 - np.exp(-(hit_rate / lines) * dt)
                if migrates is not None:  # per node: as the node would alone
                    share = share * migrates
                moved = outside * share[..., None]
                occ = occ - moved
                miss_rate = miss_rate + _ways(moved) / (LINE * dt)
        if inp.ins_per_miss is None:
            inp.ins_per_miss = inp.masks * (LINE / inp.nways)[..., None]
        ins = inp.ins_per_miss * miss_rate[..., None]  # bytes/s per (w, way)
        rate = _workloads(ins)  # (B, 1, W)
        inv = 1.0 / np.maximum(rate, 1e-30)
        free = np.maximum(wb - _workloads(occ), 0.0)
        t1 = np.minimum(free * inv, dt_w)  # time to fill the free space
        ss = ins * (wb * inv)  # split by insertion rate (0 where nobody inserts)
        decay = np.exp(rate * (t1 - dt_w) / wb)  # 1 where the way never filled
        new = ins * t1  # (occ + ins * t1 - ss) * decay + ss, in place
        new += occ
        new -= ss
        new *= decay
        new += ss
        occ = new
        # Its mask keeps at most ``hold_cap`` of its footprint (set conflicts); lines it
        # still holds outside the mask (a mask that shrank) are not limited by the mask.
        held_in = _ways(occ, inp.masks)
        over_in = held_in > inp.hold_cap
        if np.count_nonzero(over_in):
            keep = np.where(over_in, inp.hold_cap / np.maximum(held_in, 1e-30), 1.0)
            occ = occ - occ * inp.masks * (1.0 - keep)[..., None]
        # A workload holds at most its footprint: its inserts replace its own lines in the
        # ways it inserts into first (LRU within the mask), then elsewhere.
        fp = self.fp * inp.ws_s
        tot = _ways(occ)
        excess = tot - fp
        if np.count_nonzero(excess > 0):
            inside = occ * inp.masks
            held_in = _ways(inside)
            take = np.clip(np.minimum(excess, held_in), 0.0, None)
            scale_in = np.where(held_in > 0, take / np.maximum(held_in, 1e-30), 0.0)
            occ = occ - inside * scale_in[..., None]
            rest = np.maximum(excess - take, 0.0)
            now = _ways(occ)
            shrink = np.where(rest > 0, (now - rest) / np.maximum(now, 1e-30), 1.0)
            occ = occ * shrink[..., None]
            tot = _ways(occ)
        # A line of w in way j is evicted by the others' inserts at (R_j - I_wj) / way bytes.
        others = (rate - ins) / wb
        eta = _ways(occ, others) / np.maximum(tot, 1e-30)
        return occ, eta, tot

    def _outside(self, occ: np.ndarray, inp: Inputs) -> tuple:
        """(lines held outside the mask (B, n, W), which nodes migrate any ((B, 1) bool, or
        None when all do), lines held (B, n) or None when no node holds more than a line
        outside its mask): what a non-inclusive LLC's migration reads of the start
        occupancy."""
        if inp.unmask is None:
            inp.unmask = (1.0 - inp.masks) * self.non_inclusive[:, None, None]
        outside = occ * inp.unmask
        most = outside.max(axis=(1, 2))
        lines = migrates = None
        if most.max(initial=0.0) > LINE:
            lines = np.maximum(_ways(occ), LINE) / LINE
            if most.min() <= LINE:
                migrates = (most > LINE)[:, None]
        return outside, migrates, lines

    def advance(
        self,
        occ: np.ndarray,
        inp: Inputs,
        sol: Solution,
        dyn: Dynamics,
        dt: float | np.ndarray,
        iters: int = 5,
        tol: float = 2e-5,
        guess: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Occupancy (and eviction rates) after ``dt`` s, with insertion at the miss ratio
        *and access rate* of the step's end (backward Euler, solved per workload within a
        bracket, at the step's memory latency). Fills take milliseconds, far less than a
        step, and what a workload holds sets both how often it misses and how fast it runs,
        so rates taken from the step's start or middle overshoot: a small footprint next to
        a streaming neighbour would keep all of it, or none of it, a growing mask would
        fill in one step what takes a few hundred milliseconds, and neighbours trading ways
        would oscillate from step to step. Backward Euler lags instead: a fill that reaches
        12 MB in 0.1 s reaches 9.4 MB in one 0.1 s step (the steady state is exact).

        Each node iterates until its own workloads have converged (converged nodes keep
        their result and leave the batch once they are the majority), so a node's step is
        the same whichever nodes share its batch; ``dt`` is one step for every node or
        (nodes, 1).

        The first point is the step's start miss ratio, plus ``guess`` (B, n) where given:
        the correction the previous step needed (the caller's, for a node whose inputs
        drift: a load that rises keeps its occupancy moving the same way step after step,
        so the root keeps about the same distance from the start's miss ratio). Returns
        the occupancy, the eviction rates and the miss ratio each workload converged to
        (the point of its node's last evaluation)."""
        ni = bool(np.count_nonzero(self.non_inclusive))
        lat = sol.latency_ns
        model = self
        # The start occupancy is the same in every evaluation: what migrates from outside
        # the masks is read from it once.
        out = self._outside(occ, inp) if ni else None

        def step(m: np.ndarray, access: np.ndarray):
            new, eta, held = model._step_occupancy(
                occ, inp, access * m, dt, access * (1.0 - m) if ni else None, out
            )
            end = model.miss_ratio(held, inp.ws_s)
            if np.count_nonzero(model.is_lc):  # idle-gap evictions at the end's rates, too
                end = end + model.cold_misses(end, inp, Dynamics(dyn.u, dyn.rho, eta))
            return new, eta, end

        def access_at(m: np.ndarray) -> np.ndarray:
            cpu = model._cpu(inp, m, dyn)
            return cpu.rates(lat)[0] * cpu.apki / 1000.0

        # r(m) = m_end(m) - m falls as m rises (more misses fill more, and a fuller cache
        # misses less), so its root lies between the start's miss ratio and the end's that
        # it gives: bracket it there, per workload, and close in by Illinois regula falsi.
        # (Fills can be a switch: a workload that misses a little more fills its ways within
        # the step, a little less and it barely moves, so a plain iteration would jump.)
        a = sol.miss_ratio
        if guess is None or not np.count_nonzero(guess):
            new, eta, end = step(a, sol.access_rate)
        else:
            a = np.minimum(np.maximum(a + guess, 0.0), 1.0)
            new, eta, end = step(a, access_at(a))
        out_new, out_eta, out_m = new, eta, a
        ra = end - a
        live = ~(np.abs(ra).max(axis=-1) < tol)  # per node: still iterating
        n_live = np.count_nonzero(live)
        if not n_live:
            return new, eta, out_m
        rows = np.arange(self.B)  # each current row's node
        if _worth_dropping(live):
            keep = np.flatnonzero(live)
            model, inp, dyn = model.take(keep), inp.take(keep), dyn.take(keep)
            occ, lat, a, ra, end = occ[keep], lat[keep], a[keep], ra[keep], end[keep]
            out = _out_rows(out, keep)
            dt = dt[keep] if np.ndim(dt) else dt
            rows, live = rows[keep], live[keep]
        b = end
        new, eta, end = step(b, access_at(b))
        # Every node still iterating takes the result (the first step's rows are replaced
        # by reference when every node is: no gather, the same numbers).
        if n_live == self.B:
            out_new, out_eta, out_m = new, eta, b
        else:
            out_m = out_m.copy()
            out_new[rows[live]], out_eta[rows[live]], out_m[rows[live]] = (
                new[live],
                eta[live],
                b[live],
            )
        rb = end - b
        # lo: r > 0 (too few misses), hi: r < 0 (too many); the last two points bracket.
        up = ra > 0
        lo, rlo = np.where(up, a, b), np.where(up, ra, rb)
        hi, rhi = np.where(up, b, a), np.where(up, rb, ra)
        side = np.zeros_like(a)
        for _ in range(iters):
            # A node is done when each workload is within tolerance or its bracket has
            # closed: when the root lies beyond the start's and the end's miss ratio (both
            # residuals of one sign), the secant point is clipped to the bracket's end and
            # nothing can move that workload; iterating on for it refined only the others.
            live &= ~((np.abs(end - b) < tol) | (lo == hi)).all(axis=-1)
            n_live = np.count_nonzero(live)
            if not n_live:
                break
            if _worth_dropping(live):
                keep = np.flatnonzero(live)
                model, inp, dyn = model.take(keep), inp.take(keep), dyn.take(keep)
                occ, lat, out = occ[keep], lat[keep], _out_rows(out, keep)
                lo, rlo, hi, rhi, side = lo[keep], rlo[keep], hi[keep], rhi[keep], side[keep]
                dt = dt[keep] if np.ndim(dt) else dt
                rows, live = rows[keep], live[keep]
            denom = rlo - rhi
            # The secant point where the bracket's residuals differ (lo elsewhere).
            m = np.divide(lo * -rhi + hi * rlo, denom, out=lo.copy(), where=denom > 1e-15)
            m = np.minimum(np.maximum(m, np.minimum(lo, hi)), np.maximum(lo, hi))
            new, eta, end = step(m, access_at(m))
            if n_live == self.B:
                out_new, out_eta, out_m = new, eta, m
            else:
                out_new[rows[live]], out_eta[rows[live]], out_m[rows[live]] = (
                    new[live],
                    eta[live],
                    m[live],
                )
            r = end - m
            pos = r > 0
            neg = ~pos
            # Illinois: an end kept twice in a row has its residual halved (in place: the
            # bracket's arrays are this loop's own).
            np.multiply(rhi, 0.5, out=rhi, where=pos & (side == 1))
            np.multiply(rlo, 0.5, out=rlo, where=neg & (side == -1))
            np.copyto(lo, m, where=pos)
            np.copyto(rlo, r, where=pos)
            np.copyto(hi, m, where=neg)
            np.copyto(rhi, r, where=neg)
            side = np.where(pos, 1.0, -1.0)
            b = m
        return out_new, out_eta, out_m

    def start(self, u: float = 0.0) -> Dynamics:
        z = np.zeros((self.B, self.n))
        return Dynamics(np.full(self.B, u), z, z.copy())

    def steady(
        self, inp: Inputs, occ: np.ndarray | None = None, iters: int = 400
    ) -> tuple[np.ndarray, Solution, Dynamics]:
        """Converged occupancy, rates and dynamics for constant inputs (noise-free).

        Steps grow from 0.1 s towards 100 s while occupancy moves little per step (the
        per-way solution is exact for any step, so a rarely-missing workload's cache fills in
        a few steps, not thousands) and shrink again when it moves a lot: a workload whose
        miss rate depends on what it holds needs short steps to settle, not to overshoot.
        Each node has its own step and stops when it has converged (then leaves the batch),
        so its steady state is the one it would reach alone."""
        if occ is None:
            occ = np.zeros((self.B, self.n, self.W))
        dyn = self.start()
        sol = self.solve(inp, occ, dyn)
        # Converged when no way moves by more than a hundred-thousandth of the cache.
        tol = 1e-5 * (self.way_bytes * self.ways)[:, 0]
        big_move = 0.02 * self.way_bytes[:, 0]
        dt = np.full((self.B, 1), 0.1)
        out_occ, out_sol, out_eta = occ.copy(), sol.take(np.arange(self.B)), dyn.eta.copy()
        model, rows = self, np.arange(self.B)
        for _ in range(iters):
            dyn = Dynamics(sol.utilization, sol.rho, dyn.eta)
            new, eta, _ = model.advance(occ, inp, sol, dyn, dt)
            moved = np.abs(new - occ).max(axis=(1, 2))
            # Long steps jump to each step's equilibrium; halving the jump damps the
            # feedback through the rates (it changes the path, not the fixed point).
            occ = np.where(dt[:, :, None] < 1.0, new, 0.5 * (occ + new))
            dyn.eta = eta
            sol = model.solve(inp, occ, dyn, tol=1e-10)
            done = moved < tol
            if done.any():
                at = rows[done]
                out_occ[at], out_eta[at] = occ[done], eta[done]
                out_sol.put(at, sol.take(done))
                if done.all():
                    rows = rows[:0]
                    break
                keep = np.flatnonzero(~done)
                model, inp, rows = model.take(keep), inp.take(keep), rows[keep]
                occ, sol, dyn, dt = occ[keep], sol.take(keep), dyn.take(keep), dt[keep]
                moved, tol, big_move = moved[keep], tol[keep], big_move[keep]
            big = moved > big_move
            dt = np.where(big[:, None], np.maximum(dt * 0.5, 0.1), np.minimum(dt * 1.5, 100.0))
        if len(rows):  # out of iterations: where they got to
            out_occ[rows], out_eta[rows] = occ, dyn.eta
            out_sol.put(rows, sol)
        return out_occ, out_sol, Dynamics(out_sol.utilization, out_sol.rho, out_eta)


class _Rows(Model):
    """Some nodes of a model (:meth:`Model.take`): parameter rows gathered on first use."""

    def __getattr__(self, name: str):
        root = self.__dict__.get("_root")
        if root is None or name not in root._node_arrays:
            raise AttributeError(name)
        value = getattr(root, name)[self._rows_of]
        setattr(self, name, value)
        return value

    def put(self, idx, other) -> None:
        raise TypeError("put() replaces nodes of a whole model, not of a taken view")


def _fixed_point(h, u0: np.ndarray, tol: float) -> np.ndarray:
    """Per node, the u in [0, U_MAX] with h(u) = 0 for a decreasing h (demand / peak - u):
    the root lies between a guess and its image, so bracket there and refine with Illinois
    regula falsi (usually 1-3 evaluations from the previous step's u)."""
    if u0.shape[0] == 1:
        return np.array(
            [_fixed_point_one(lambda x: float(h(np.array([x]))[0][0]), float(u0[0]), tol)]
        )
    u = np.clip(u0, 0.0, U_MAX)
    hu = h(u)[0]
    done = np.abs(hu) <= tol
    if done.all():
        return u
    u1 = np.clip(u + hu, 0.0, U_MAX)
    h1 = h(u1)[0]
    up = hu > 0
    lo, hlo = np.where(up, u, u1), np.where(up, hu, h1)
    hi, hhi = np.where(up, u1, u), np.where(up, h1, hu)
    bad = ~done & ((hlo < 0) | (hhi > 0))  # clipped at an end: the whole range
    if bad.any():
        ends = np.array([0.0, U_MAX])
        h_lo, h_hi = h(np.zeros_like(u))[0], h(np.full_like(u, U_MAX))[0]
        lo, hlo = np.where(bad, ends[0], lo), np.where(bad, h_lo, hlo)
        hi, hhi = np.where(bad, ends[1], hi), np.where(bad, h_hi, hhi)
    u = np.where(done, u, u1)
    side = np.zeros_like(u)
    for _ in range(60):
        # Ends that already solve it (demand at the bound is already on the line).
        at_hi, at_lo = hhi >= 0, hlo <= 0
        new = np.where(
            at_hi,
            hi,
            np.where(at_lo, lo, (lo * hhi - hi * hlo) / np.where(hhi != hlo, hhi - hlo, 1.0)),
        )
        u = np.where(done, u, new)
        done = done | at_hi | at_lo
        if done.all():
            break
        hn = h(u)[0]
        done = done | (np.abs(hn) <= tol) | (hi - lo < 1e-9)
        pos = ~done & (hn > 0)
        neg = ~done & (hn <= 0)
        hhi = np.where(pos & (side == 1), hhi * 0.5, hhi)
        lo, hlo = np.where(pos, u, lo), np.where(pos, hn, hlo)
        hlo = np.where(neg & (side == -1), hlo * 0.5, hlo)
        hi, hhi = np.where(neg, u, hi), np.where(neg, hn, hhi)
        side = np.where(pos, 1.0, np.where(neg, -1.0, side))
    return u


def _fixed_point_one(h, u0: float, tol: float) -> float:
    """:func:`_fixed_point` for one node, on floats (a single node steps several times
    faster without the per-node masks)."""
    u0 = min(max(u0, 0.0), U_MAX)
    h0 = h(u0)
    if abs(h0) <= tol:
        return u0
    u1 = min(max(u0 + h0, 0.0), U_MAX)
    h1 = h(u1)
    lo, hlo, hi, hhi = (u0, h0, u1, h1) if h0 > 0 else (u1, h1, u0, h0)
    if hlo < 0 or hhi > 0:  # clipped at an end: the whole range
        lo, hi = 0.0, U_MAX
        hlo, hhi = h(lo), h(hi)
    u, side = u1, 0
    for _ in range(60):
        if hhi >= 0:
            return hi
        if hlo <= 0:
            return lo
        u = (lo * hhi - hi * hlo) / (hhi - hlo)
        hu = h(u)
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


def amd_cap_bps(value: int) -> float:
    """AMD L3 QoS bandwidth limit: ``value`` in 1/8 GB/s units (a floor keeps 0 finite)."""
    return max(float(value), 0.2) * 0.125e9 if math.isfinite(value) else math.inf

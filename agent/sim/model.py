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
The two per-step solves, the fixed point and the occupancy step, run compiled, node by node
(:mod:`agent.sim.kernel`); this module holds the parameters and packs them for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.sim import kernel
from agent.sim.catalog import MachinePreset, WorkloadSpec
from agent.sim.kernel import LINE


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
    packed: np.ndarray | None = None  # the arrays as the kernel reads them (lazily)

    def take(self, idx: np.ndarray) -> Inputs:
        """The inputs of nodes ``idx`` (lazily computed parts included)."""
        return Inputs(
            *(getattr(self, f)[idx] for f in _INPUT_ARRAYS),
            hold_cap=_rows(self.hold_cap, idx),
            packed=_rows(self.packed, idx),
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


# What a model keeps of its own rows, besides its parameter arrays: never a view's.
_PER_ROWS = ("_packed_arrays", "_count_array")


def _rows(x, idx):
    return None if x is None else x[idx]


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
        own = (*root._node_arrays, *_PER_ROWS)
        sub.__dict__.update({k: v for k, v in vars(root).items() if k not in own})
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
        for cached in _PER_ROWS:
            self.__dict__.pop(cached, None)
        for j, i in enumerate(idx):
            self.presets[i] = other.presets[j]
            self.specs[i] = other.specs[j]

    # ------------------------------------------------------------------ pieces

    def latency(self, u: np.ndarray) -> np.ndarray:
        """Loaded memory latency (ns) at utilisation ``u`` (B,) of each node's peak."""
        machine = self._packed()[0]
        return np.array([kernel.latency(machine, b, float(x)) for b, x in enumerate(u)])

    def hold_cap(
        self, nways: np.ndarray, ws_s: np.ndarray, rows: np.ndarray | None = None
    ) -> np.ndarray:
        """Bytes of its footprint each workload of nodes ``rows`` (None: all) can hold in
        its mask's ``nways`` ways (:func:`kernel.hold_cap`: set conflicts near the
        footprint); ``nways`` and ``ws_s`` are those nodes' rows."""
        machine, workloads, _ = self._packed()
        return kernel.hold_cap(
            machine,
            workloads,
            np.ascontiguousarray(nways, dtype=float),
            np.ascontiguousarray(ws_s, dtype=float),
            self.W,
            self._rows(rows),
        )

    def _packed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The parameters as :mod:`agent.sim.kernel` reads them: (machine (B, fields),
        workloads (B, n, fields), knees (B, n, knees, fields)); built once per model."""
        packed = self.__dict__.get("_packed_arrays")
        if packed is None:
            root = self.__dict__.get("_root")
            if root is not None:
                packed = tuple(x[self._rows_of] for x in root._packed())
            else:
                machine = (
                    self.way_bytes[:, 0],
                    self.freq[:, 0],
                    self.hz[:, 0],
                    self.L0,
                    self.lat_slope,
                    self.lat_queue,
                    self.hit_share[:, 0],
                    self.peak,
                    self.non_inclusive.astype(float),
                )
                workloads = (
                    self.cpi_base,
                    self.apki,
                    self.mlp,
                    self.wb,
                    self.fp,
                    self.floor,
                    self.span,
                    self.is_lc.astype(float),
                    self.ipr,
                    self.burst,
                    self.reuse,
                    self.io_s,
                    self.dma,
                    self.workers,
                )
                assert len(machine) == kernel.MACHINE_FIELDS
                assert len(workloads) == kernel.WORKLOAD_FIELDS
                packed = (
                    np.stack(machine, axis=-1),
                    np.stack(workloads, axis=-1),
                    np.stack((self.kw, self.kr, self.ks, self.kend), axis=-1),
                )
            self._packed_arrays = packed
        return packed

    def _counts(self) -> np.ndarray:
        """(B,) how many workloads each node has: they are its first rows, the rest pad the
        batch (padding rows never run, so the solves skip them)."""
        counts = self.__dict__.get("_count_array")
        if counts is None:
            counts = self._count_array = self.valid.sum(axis=1).astype(np.int64)
        return counts

    def _packed_inputs(self, inp: Inputs) -> np.ndarray:
        if inp.packed is None:
            if inp.hold_cap is None:
                inp.hold_cap = self.hold_cap(inp.nways, inp.ws_s)
            inp.packed = kernel.pack_inputs(inp)
        return inp.packed

    # ------------------------------------------------------------------ the operating point

    def solve(
        self,
        inp: Inputs,
        occ: np.ndarray,
        dyn: Dynamics,
        tol: float = 1e-6,
        rows: np.ndarray | None = None,
    ) -> Solution:
        """Rates at the fixed point of CPI <-> bandwidth <-> memory latency, for the
        occupancy ``occ`` held now (``dyn.u`` is the warm start): :func:`kernel.solve`.
        ``rows``: solve only those nodes (the solution's rows, in that order), reading
        every node's ``inp``, ``occ`` and ``dyn`` at them (None: every node)."""
        machine, workloads, knees = self._packed()
        out, lat, u = kernel.solve(
            machine,
            workloads,
            knees,
            self._packed_inputs(inp),
            np.ascontiguousarray(occ, dtype=float),
            self._counts(),
            np.ascontiguousarray(dyn.u, dtype=float),
            np.ascontiguousarray(dyn.rho, dtype=float),
            np.ascontiguousarray(dyn.eta, dtype=float),
            float(tol),
            self._rows(rows),
        )
        return Solution(*out, lat, u)

    def _rows(self, rows: np.ndarray | None) -> np.ndarray:
        """Node indices for a kernel: ``rows``, or every node."""
        return np.arange(self.B) if rows is None else np.asarray(rows, dtype=np.int64)

    # ------------------------------------------------------------------ occupancy

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
        rows: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Occupancy (and eviction rates) after ``dt`` s, with insertion at the miss ratio
        *and access rate* of the step's end (backward Euler, solved per workload within a
        bracket, at the step's memory latency: :func:`kernel.advance`). Fills take
        milliseconds, far less than a step, and what a workload holds sets both how often it
        misses and how fast it runs, so rates taken from the step's start or middle
        overshoot: a small footprint next to a streaming neighbour would keep all of it, or
        none of it, a growing mask would fill in one step what takes a few hundred
        milliseconds, and neighbours trading ways would oscillate from step to step.
        Backward Euler lags instead: a fill that reaches 12 MB in 0.1 s reaches 9.4 MB in
        one 0.1 s step (the steady state is exact).

        Each node iterates until its own workloads have converged, so a node's step is the
        same whichever nodes share its batch; ``dt`` is one step for every node or
        (nodes, 1).

        The first point is the step's start miss ratio, plus ``guess`` (B, n) where given:
        the correction the previous step needed (the caller's, for a node whose inputs
        drift: a load that rises keeps its occupancy moving the same way step after step,
        so the root keeps about the same distance from the start's miss ratio). Returns
        the occupancy, the eviction rates and the miss ratio each workload converged to
        (the point of its node's last evaluation).

        ``rows``: advance only those nodes, as :meth:`solve` solves them (``sol``,
        ``dt`` and ``guess`` are theirs, in that order; ``occ``, ``inp`` and ``dyn``
        every node's)."""
        at = self._rows(rows)
        B = len(at)
        steps = np.empty(B)
        steps[:] = np.asarray(dt, dtype=float).reshape(-1)
        new, eta, m, _ = kernel.advance(
            *self.occupancy_args(inp, occ),
            np.ascontiguousarray(sol.miss_ratio, dtype=float),
            np.ascontiguousarray(sol.access_rate, dtype=float),
            np.ascontiguousarray(sol.latency_ns, dtype=float),
            np.ascontiguousarray(dyn.rho, dtype=float),
            steps,
            np.zeros((B, self.n)) if guess is None else np.ascontiguousarray(guess, dtype=float),
            int(iters),
            float(tol),
            at,
        )
        return new, eta, m

    def occupancy_args(self, inp: Inputs, occ: np.ndarray) -> tuple[np.ndarray, ...]:
        """The arguments :func:`kernel.advance` and :func:`kernel.steady` open with: the
        packed parameters and inputs, the masks, the occupancy ``occ`` and the workload
        counts."""
        return (
            *self._packed(),
            self._packed_inputs(inp),
            np.ascontiguousarray(inp.masks, dtype=float),
            np.ascontiguousarray(occ, dtype=float),
            self._counts(),
        )

    def steady_tolerances(self) -> tuple[np.ndarray, np.ndarray]:
        """(B,) each node's steady-state test and its "big move", in bytes of a way moved
        in one step: converged below a hundred-thousandth of the cache; above 2% of a way
        the step shrinks."""
        return 1e-5 * (self.way_bytes * self.ways)[:, 0], 0.02 * self.way_bytes[:, 0]

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
        Each node has its own step and stops when it has converged, so its steady state is
        the one it would reach alone; :func:`kernel.steady` runs each node's loop to its end
        in one compiled call (a few nodes of a random batch need all ``iters`` steps, which
        as one batched call per step cost more than the rest of an episode's start)."""
        if occ is None:
            occ = np.zeros((self.B, self.n, self.W))
        out_occ, out, lat, u, out_eta, _ = kernel.steady(
            *self.occupancy_args(inp, occ), *self.steady_tolerances(), int(iters)
        )
        out_sol = Solution(*out, lat, u)
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


def amd_cap_bps(value: int) -> float:
    """AMD L3 QoS bandwidth limit: ``value`` in 1/8 GB/s units (a floor keeps 0 finite)."""
    return max(float(value), 0.2) * 0.125e9 if math.isfinite(value) else math.inf

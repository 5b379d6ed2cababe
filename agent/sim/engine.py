"""The simulated workloads of one or more nodes, stepped through time together.

An :class:`Engine` owns everything that moves with time for ``B`` nodes, each running one
scenario: which instances are active, batch phases, LC offered load, the LLC occupancy and
the model's dynamics, per-workload counters, and LC request accounting (a fluid backlog and,
per step, the request count and the parameters of the latency distribution). It knows
nothing of resctrl groups: its owner says, per workload instance, which ways it may insert
into and what MBA delay or bandwidth cap it runs under (:meth:`Engine.set_allocation`).
:class:`agent.sim.node.SimNode` owns a one-node engine; :class:`agent.sim.batch.SimBatch`
a wide one. Every per-step quantity is an array over (nodes, workloads), so a step of many
nodes is one pass of array operations (docs/SIMULATOR.md, "State and one step"):

- inputs: activity from arrival/departure times; load levels and batch phases are
  piecewise constant (diurnal loads aside, computed on arrays), so each (node, workload)
  keeps its current level and phase with the interval they hold for, and only entries
  whose interval has run out are looked up again;
- a node whose inputs did not change and whose occupancy has converged is *settled*: its
  operating point holds and the model is not run for it; the others are solved together
  (:meth:`agent.sim.model.Model.take`), each converging on its own;
- LC accounting: backlogs and the per-step records (requests, mean backlog, service time,
  utilisation) are arrays; the request counts are drawn from each service's own stream.

Nodes are independent and can be reset one at a time (:meth:`Engine.reset_nodes`); the
arrays are padded to the most workloads and ways any scenario it will hold can have.

Randomness comes from ``numpy`` streams spawned from each node's seed at reset: one for
measurement noise and bursty load schedules, one per LC service's requests (so changing one
service's load or allocation never shifts another's draws: common random numbers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from agent.sim.catalog import MachinePreset, Phase, WorkloadSpec
from agent.sim.latency import (
    LatencyTable,
    Pooled,
    TableStack,
    fluid_backlog,
    noisy_groups,
    observed_many,
    observed_pooled,
    pooled_for_observation,
    table_for,
    with_stalls,
)
from agent.sim.latency_kernel import record_step
from agent.sim.model import Dynamics, Inputs, Model, Solution
from agent.sim.scenario import LoadSchedule, Scenario, diurnal
from agent.sim.streams import Streams

BACKLOG_CAP_S = 30.0  # clients time out: a queue never holds more than this much work
COUNTERS = 5  # instructions, cycles, LLC references, LLC misses, memory bytes
_PARTS = 16  # initial per-service room for step records between two reads (grows)
# Observations of at most this many services keep their pooled quantiles by operating
# point (a bigger batch's key costs more than its hits save), and so many of them.
_POOLED_MEMO_SERVICES = 16
_POOLED_MEMO_SIZE = 64


@dataclass
class LcService:
    """One LC instance of one node: its load and request stream (its queue and the requests
    since the last read are the engine's arrays)."""

    index: int  # workload index within the node
    schedule: LoadSchedule
    scale: float  # schedule unit -> req/s
    workers: int
    table: LatencyTable
    base_s: float  # latency outside the modelled CPU work
    rng: np.random.Generator
    capacity_rps: float  # req/s at utilisation 1, full resources alone


class LatencyGroups(NamedTuple):
    """Monitored groups of LC services, as :meth:`Engine.latency_of` takes them."""

    mb: np.ndarray  # (M,) node of each member service, members in group order
    mi: np.ndarray  # (M,) its workload index
    owner: np.ndarray  # (M,) its group
    rngs: Streams  # (G,) each group's sampling-error stream (its first member's), or None


def describe(scn: Scenario) -> tuple[MachinePreset, list[WorkloadSpec], list[int]]:
    """A scenario's machine preset, workload specs and threads per instance."""
    cat = scn.catalog
    specs = [cat.workload(w.workload) for w in scn.workloads]
    threads = [w.threads or s.threads for w, s in zip(scn.workloads, specs, strict=True)]
    return cat.machine(scn.machine), specs, threads


class Engine:
    """Workloads of ``len(scenarios)`` nodes stepped together.

    Args:
        scenarios: each node's scenario.
        seeds: each node's seed.
        solo: ``solo(preset, spec, threads) -> (IPS, CPI)`` of a workload alone with every
            way and full bandwidth (the basis of ``utilization`` loads).
        n, W, knees: pad to this many workloads, ways and MRC knees (default: what these
            scenarios need), so that later resets can bring larger scenarios.
    """

    def __init__(
        self,
        scenarios: Sequence[Scenario],
        seeds: Sequence[int],
        solo,
        *,
        n: int | None = None,
        W: int | None = None,
        knees: int | None = None,
    ) -> None:
        self.scenarios = list(scenarios)
        self.solo = solo
        self.B = len(self.scenarios)
        described = [describe(s) for s in self.scenarios]
        self.presets = [d[0] for d in described]
        self.specs = [d[1] for d in described]
        self.threads = [d[2] for d in described]
        self.model = Model(self.presets, self.specs, self.threads, n=n, W=W, knees=knees)
        B, n, W = self.B, self.model.n, self.model.W
        self.t = np.zeros(B)
        self.occ = np.zeros((B, n, W))
        self.dyn = self.model.start()
        self.acc = np.zeros((B, n, COUNTERS))
        # Allocation inputs, set by the owner (default: every way, no MBA limit).
        self.masks = np.zeros((B, n, W))
        self.nways = np.ones((B, n))
        self.delay = np.zeros((B, n))
        self.cap = np.full((B, n), np.inf)
        # Inputs at the latest step (what the settled test compares with) and the parts
        # of the occupancy update that depend on the allocation and phases only.
        self.lam = np.zeros((B, n))
        self.act = np.zeros((B, n))
        self.mult = np.ones((B, n, 3))  # phase multipliers: apki, working set, base CPI
        self._phase_no = np.zeros((B, n), dtype=np.int64)
        self.cores = np.ones((B, n))
        self._hold_cap = np.zeros((B, n))
        self._stale = np.ones(B, dtype=bool)  # the one above needs recomputing
        self._moved = np.ones(B, dtype=bool)  # allocation changed since the last step
        self._settled = np.zeros(B, dtype=bool)
        # Per workload, how far the occupancy solver's root lay from the start's miss
        # ratio at the node's last step (Model.advance's first guess for the next one).
        self._correction = np.zeros((B, n))
        self._rates = np.zeros((B, n, COUNTERS))
        self._service = np.zeros((B, n))
        self._rho = np.zeros((B, n))
        # Arrival/departure, load and phase schedules.
        self._start = np.full((B, n), np.inf)
        self._end = np.full((B, n), np.inf)
        self._scale = np.zeros((B, n))
        self._diurnal = np.zeros((B, n), dtype=bool)
        self._dparams = np.zeros((4, B, n))  # level, amplitude, period, phase
        self._dparams[2] = 1.0
        self._level = np.zeros((B, n))
        self._lo = np.full((B, n), np.inf)  # [lo, hi): where _level holds
        self._hi = np.full((B, n), -np.inf)
        self._ph_lo = np.full((B, n), np.inf)
        self._ph_hi = np.full((B, n), -np.inf)
        self._phased_mask = np.zeros((B, n), dtype=bool)
        # LC accounting: per (node, workload); rows of non-LC workloads stay 0.
        self.backlog = np.zeros((B, n))  # fluid backlog (work seconds per worker)
        self.count = np.zeros((B, n), dtype=np.int64)  # requests since the last read
        # Per step since the last read: [requests, mean backlog (s), service time (s), rho].
        self.parts = np.zeros((B, n, _PARTS, 4))
        self.nparts = np.zeros((B, n), dtype=np.int64)
        self._table_no = np.zeros((B, n), dtype=np.int64)
        self._tables: list[LatencyTable] = []
        self._table_stack: TableStack | None = None  # the tables read as one
        self._base = np.zeros((B, n))
        # Worker stalls of an LC service: [stall length (s), stalls per request].
        self._stall = np.zeros((B, n, 2))
        self.rng: list[np.random.Generator] = [None] * B  # type: ignore[list-item]
        self.lc: list[list[LcService]] = [[] for _ in range(B)]
        self._phased: list[list[int]] = [[] for _ in range(B)]
        self._period: list[dict[int, float]] = [{} for _ in range(B)]
        self._cores_total = np.ones((B, 1))
        self._settle_bytes = np.zeros(B)
        # Pooled latency quantiles by operating point (latency_of): a settled service
        # asks for the same ones every interval.
        self._pooled_memo: dict[tuple, Pooled | None] = {}
        self._pooled_ids: tuple | None = None  # the services of the last key, its bytes
        self._calm: tuple[np.ndarray, ...] | None = None  # _refresh's quiet window
        self._stalls = False  # some service has worker stalls
        self.reset_nodes(range(B), self.scenarios, seeds)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_calm", None)
        self.__dict__.setdefault("_table_stack", None)
        self._lookups = None  # a cache, rebuilt on next use (older pickles held fewer fields)
        self._lc_index = None  # rebuilt from the services on next use (older pickles too)
        if "_correction" not in state:  # pickled before the solver carried its correction
            self._correction = np.zeros(self.lam.shape)
        if "_pooled_memo" not in state:  # pickled before the pooled quantiles were kept
            self._pooled_memo, self._pooled_ids = {}, None
            self._stalls = bool(np.count_nonzero(self._stall[..., 0]))

    # ------------------------------------------------------------------ reset

    def reset_nodes(
        self, nodes: Sequence[int], scenarios: Sequence[Scenario], seeds: Sequence[int]
    ) -> None:
        """Start nodes ``nodes`` afresh with ``scenarios`` and ``seeds``: time 0, empty
        caches, every way and no MBA limit, counters and queues empty."""
        nodes = [int(b) for b in nodes]
        if not nodes:
            return
        described = [describe(s) for s in scenarios]
        presets = [d[0] for d in described]
        specs = [d[1] for d in described]
        threads = [d[2] for d in described]
        m = self.model
        m.put(nodes, Model(presets, specs, threads, n=m.n, W=m.W, knees=m.knees))
        idx = np.array(nodes)
        for arr, value in (
            (self.t, 0.0),
            (self.occ, 0.0),
            (self.acc, 0.0),
            (self.dyn.u, 0.0),
            (self.dyn.rho, 0.0),
            (self.dyn.eta, 0.0),
            (self.delay, 0.0),
            (self.cap, np.inf),
            (self.backlog, 0.0),
            (self.count, 0),
            (self.nparts, 0),
            (self._rates, 0.0),
            (self._service, 0.0),
            (self._rho, 0.0),
            (self._correction, 0.0),
            (self._start, np.inf),
            (self._end, np.inf),
            (self._scale, 0.0),
            (self._diurnal, False),
            (self._phased_mask, False),
            (self._lo, np.inf),
            (self._hi, -np.inf),
            (self._ph_lo, np.inf),
            (self._ph_hi, -np.inf),
            (self.mult, 1.0),
            (self._phase_no, 0),
            (self._base, 0.0),
            (self._stall, 0.0),
        ):
            arr[idx] = value
        self.masks[idx] = m.way_valid[idx][:, None, :]
        self.nways[idx] = m.ways[idx]
        self._dparams[:, idx] = 0.0
        self._dparams[2, idx] = 1.0
        self._stale[idx] = True
        self._moved[idx] = True
        self._settled[idx] = False
        self._cores_total[idx, 0] = [p.cores for p in presets]
        self._settle_bytes[idx] = [1e-5 * p.way_bytes * p.ways for p in presets]
        for b, scn, seed, (preset, sp, th) in zip(nodes, scenarios, seeds, described, strict=True):
            self.scenarios[b] = scn
            self.presets[b], self.specs[b], self.threads[b] = preset, sp, th
            self._reset_node(b, scn, int(seed))

    def _reset_node(self, b: int, scn: Scenario, seed: int) -> None:
        preset, specs, threads = self.presets[b], self.specs[b], self.threads[b]
        streams = np.random.SeedSequence(seed).spawn(1 + len(scn.workloads))
        rng = np.random.default_rng(streams[0])
        self.rng[b] = rng
        horizon = max(3600.0, scn.duration_s or 0.0)
        services = []
        for i, (inst, spec) in enumerate(zip(scn.workloads, specs, strict=True)):
            self._start[b, i] = inst.start_s
            self._end[b, i] = math.inf if inst.end_s is None else inst.end_s
            if spec.kind != "lc":
                continue
            lc = spec.lc
            _, cpi = self.solo(preset, spec, threads[i])
            svc = lc.instructions_per_request * cpi / (preset.freq_ghz * 1e9) + lc.io_ms * 1e-3
            workers = min(lc.workers, threads[i])  # never more workers than threads
            capacity = workers / svc
            scale = capacity if inst.load.unit == "utilization" else 1.0
            service = LcService(
                index=i,
                schedule=inst.load.schedule(rng, horizon),
                scale=scale,
                workers=workers,
                table=table_for(lc.service, lc.burst),
                base_s=lc.base_latency_ms * 1e-3,
                rng=np.random.default_rng(streams[1 + i]),
                capacity_rps=capacity,
            )
            services.append(service)
            self._scale[b, i] = scale
            self._base[b, i] = service.base_s
            self._stall[b, i] = (lc.stall_ms * 1e-3, lc.stalls_per_request)
            self._table_no[b, i] = self._table_index(service.table)
            p = inst.load
            if not service.schedule.piecewise:
                self._diurnal[b, i] = True
                self._dparams[:, b, i] = (p.level, p.amplitude, p.period_s, p.phase)
        self.lc[b] = services
        phased = [i for i, s in enumerate(specs) if s.phases]
        self._phased[b] = phased
        self._period[b] = {i: sum(p.duration_s for p in specs[i].phases) for i in phased}
        self._phased_mask[b, phased] = True
        self._lc_index = None  # the flat list of services is rebuilt on next use
        self._pooled_memo.clear()  # services changed: their operating points too
        self._stalls = bool(np.count_nonzero(self._stall[..., 0]))
        self._lookups = None  # and which entries have schedules to look up
        self._calm = None  # and when they next change

    def reseed(self, b: int, seed: int | Sequence[int]) -> None:
        """Node ``b``'s generators (its noise, its LC services' requests) continue from the
        streams ``seed`` spawns, laid out as a reset lays them out. Their states change in
        place: every view that holds them (the typed lists of the compiled draws, the
        latency views) draws the new numbers with no rebuilding."""
        streams = np.random.SeedSequence(seed).spawn(1 + len(self.scenarios[b].workloads))
        self.rng[b].bit_generator.state = np.random.PCG64(streams[0]).state
        for s in self.lc[b]:
            s.rng.bit_generator.state = np.random.PCG64(streams[1 + s.index]).state

    def _table_index(self, table: LatencyTable) -> int:
        for k, t in enumerate(self._tables):
            if t is table:
                return k
        self._tables.append(table)
        self._table_stack = None
        return len(self._tables) - 1

    def _services(self) -> tuple[np.ndarray, np.ndarray, Streams]:
        """(node, workload) of every LC service in node order, and their request streams."""
        if self._lc_index is None:
            pairs = [(b, s.index, s.rng) for b in range(self.B) for s in self.lc[b]]
            self._lc_index = (
                np.array([p[0] for p in pairs], dtype=np.int64),
                np.array([p[1] for p in pairs], dtype=np.int64),
                Streams([p[2] for p in pairs]),
            )
        return self._lc_index

    # ------------------------------------------------------------------ inputs

    def set_allocation(
        self,
        b,
        masks: np.ndarray,
        nways: np.ndarray,
        delay: np.ndarray,
        cap: np.ndarray,
        moved=True,
    ) -> None:
        """Per-workload masks (workloads x W, 0/1), ways, MBA delay and bandwidth cap of node
        ``b``, or of nodes ``b`` (an index array; arrays with a leading node axis). Nodes
        with ``moved`` (a flag, or one per node) leave their settled operating point."""
        if np.ndim(b) == 0:
            rows = (b, slice(0, len(self.specs[b])))
        else:
            b = np.asarray(b)
            rows = (b,)
        self.masks[rows] = np.asarray(masks)[..., : self.model.W]
        self.nways[rows] = nways
        self.delay[rows] = delay
        self.cap[rows] = cap
        if np.ndim(b) == 0:
            self._stale[b] = True
            self._moved[b] |= bool(moved)
        else:
            self._stale[b] = True
            self._moved[b] |= np.broadcast_to(moved, b.shape)

    def active(self, b: int, t: float) -> list[bool]:
        return [
            w.start_s <= t and (w.end_s is None or t < w.end_s) for w in self.scenarios[b].workloads
        ]

    def phase(self, b: int, i: int, t: float) -> Phase:
        return self._phase_at(b, i, t)[0]

    def _phase_at(self, b: int, i: int, t: float) -> tuple[Phase, int, float, float]:
        """(phase of workload ``i`` of node ``b`` at ``t``, its number, and an interval
        [start, end) around ``t`` within that phase)."""
        phases = self.specs[b][i].phases
        x = (t - self.scenarios[b].workloads[i].start_s) % self._period[b][i]
        at = t - x
        pad = 1e-9 * max(1.0, abs(t))  # kept a hair inside the phase's boundaries
        for k, p in enumerate(phases):
            if x < p.duration_s:
                return p, k, at + pad, at + p.duration_s - pad
            x -= p.duration_s
            at += p.duration_s
        return phases[-1], len(phases) - 1, t, t  # rounding at the cycle's end: look again

    def load(self, b: int, i: int, t: float) -> float:
        """Offered load (req/s) of LC workload ``i`` of node ``b`` at ``t``."""
        for s in self.lc[b]:
            if s.index == i:
                return s.schedule.level(t) * s.scale
        raise ValueError("not an LC service")

    def _refresh(self, t: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        """Set the inputs of nodes ``rows`` (None: all) at their times ``t`` (one per
        node); return which of them changed since their last step."""
        if rows is None and self._quiet(t):
            # No activity, load segment or phase can have changed since the last refresh:
            # what it set holds (a settled node's steps skip the lookups).
            return np.zeros(self.B, dtype=bool)
        sel = slice(None) if rows is None else rows
        tt = t[sel][:, None]
        act = ((self._start[sel] <= tt) & (tt < self._end[sel])).astype(float)
        if self._lookups is None:  # (piecewise loads, phased workloads, any of each, ...)
            piecewise = (self._scale > 0) & ~self._diurnal
            self._lookups = (
                piecewise,
                bool(np.count_nonzero(piecewise)),
                bool(np.count_nonzero(self._diurnal)),
                bool(np.count_nonzero(self._phased_mask)),
                np.nonzero(self._diurnal),  # (nodes, workloads) of the diurnal loads
            )
        piecewise, any_piecewise, any_diurnal, any_phased, diurnals = self._lookups
        # Piecewise loads and phases: look up only where the current interval ran out.
        if any_piecewise:
            out = (tt < self._lo[sel]) | (tt >= self._hi[sel])
            out &= piecewise[sel]
            for r, i in zip(*np.nonzero(out), strict=True):
                b = r if rows is None else rows[r]
                sched = next(s.schedule for s in self.lc[b] if s.index == i)
                self._level[b, i], self._lo[b, i], self._hi[b, i] = sched.segment(float(t[b]))
        level = self._level[sel]
        if any_diurnal:
            # A few percent of the loads are diurnal: evaluate those alone.
            r, i = diurnals if rows is None else np.nonzero(self._diurnal[rows])
            d = self._dparams[:, r if rows is None else rows[r], i]
            level = level.copy()
            level[r, i] = diurnal(d[0], d[1], d[2], d[3], tt[r, 0])
        lam = level * self._scale[sel]
        phase_changed = self._look_up_phases(t, tt, rows) if any_phased else None
        moved = self._moved[sel]
        act_changed = (act != self.act[sel]).any(axis=1)
        changed = act_changed | (lam != self.lam[sel]).any(axis=1) | moved
        if phase_changed is not None:
            changed |= phase_changed
            if rows is None:
                self._stale |= phase_changed
            else:
                self._stale[rows[phase_changed]] = True
        self.act[sel] = act
        self.lam[sel] = lam
        # Oversubscribed cores are shared: every thread gets cores / threads of one. They
        # follow activity and threads (which change only at a reset, which moves the node).
        if np.count_nonzero(act_changed) or np.count_nonzero(moved):
            threads = self.model.threads[sel]
            total = (threads * act).sum(axis=1, keepdims=True)
            share = np.minimum(1.0, self._cores_total[sel] / np.maximum(total, 1e-9))
            self.cores[sel] = threads * share
        self._calm = None if rows is not None or any_diurnal else self._calm_window(tt, piecewise)
        return changed

    def _quiet(self, t: np.ndarray) -> bool:
        """Every node's time ``t`` within the quiet window of the last refresh, and no
        node moved since (:meth:`_calm_window`)."""
        calm = self._calm
        return (
            calm is not None
            and not np.count_nonzero(self._moved)
            and bool((calm[0] <= t).all())
            and bool((t < calm[1]).all())
        )

    def _look_up_phases(self, t: np.ndarray, tt: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        """Phases of nodes ``rows`` (None: all) at times ``tt`` (rows, 1), looked up where
        the current one ran out; which of the nodes changed phase."""
        sel = slice(None) if rows is None else rows
        ph = self._phased_mask[sel] & ((tt < self._ph_lo[sel]) | (tt >= self._ph_hi[sel]))
        phase_changed = np.zeros(len(tt), dtype=bool)
        for r, i in zip(*np.nonzero(ph), strict=True):
            b = r if rows is None else rows[r]
            p, k, lo, hi = self._phase_at(b, i, float(t[b]))
            self._ph_lo[b, i], self._ph_hi[b, i] = lo, hi
            if k != self._phase_no[b, i] or self._stale[b]:
                self._phase_no[b, i] = k
                self.mult[b, i] = (p.apki, p.ws, p.cpi)
                phase_changed[r] = True
        return phase_changed

    def _calm_window(self, tt: np.ndarray, piecewise: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per node, the times [from, until) over which nothing :meth:`_refresh` looks up can
        change after a refresh of every node at times ``tt`` (B, 1): no workload starts or
        ends, and every load segment and phase looked up holds (diurnal loads move always)."""
        inf = np.inf
        lo = np.maximum(
            np.where(piecewise, self._lo, -inf).max(axis=1),
            np.where(self._phased_mask, self._ph_lo, -inf).max(axis=1),
        )
        hi = np.minimum(
            np.minimum(
                np.where(self._start > tt, self._start, inf).min(axis=1),
                np.where(self._end > tt, self._end, inf).min(axis=1),
            ),
            np.minimum(
                np.where(piecewise, self._hi, inf).min(axis=1),
                np.where(self._phased_mask, self._ph_hi, inf).min(axis=1),
            ),
        )
        return np.maximum(lo, tt[:, 0]), hi

    def _inputs(self, rows: np.ndarray | None, whole: bool = False) -> Inputs:
        """Model inputs of nodes ``rows`` (None: all) as set by the latest refresh, with the
        allocation-dependent parts (recomputed where the allocation or a phase moved);
        ``whole``: every node's inputs, those parts recomputed at ``rows`` only."""
        stale = self._stale if rows is None else self._stale[rows]
        if np.count_nonzero(stale):
            at = np.flatnonzero(self._stale) if rows is None else rows[stale]
            ws = self.mult[at, :, 1]
            self._hold_cap[at] = self.model.hold_cap(self.nways[at], ws, at)
            self._stale[at] = False
        sel = slice(None) if rows is None or whole else rows
        mult = self.mult[sel]
        return Inputs(
            self.masks[sel],
            self.nways[sel],
            self.delay[sel],
            self.cap[sel],
            self.act[sel],
            mult[..., 0],
            mult[..., 1],
            mult[..., 2],
            self.lam[sel],
            self.cores[sel],
            hold_cap=self._hold_cap[sel],
        )

    def inputs(self, t: np.ndarray | None = None, rows: np.ndarray | None = None) -> Inputs:
        """Model inputs of nodes ``rows`` (None: all) at times ``t`` (default: now)."""
        self._refresh(self.t if t is None else np.asarray(t, dtype=float), rows)
        return self._inputs(rows)

    def warm(self, rows: Sequence[int] | None = None) -> None:
        """Start nodes ``rows`` (None: all) warm: caches hold the steady state of their
        inputs now (noise-free), as a machine that has run this mix for a while."""
        idx = None if rows is None else np.asarray(rows, dtype=np.int64)
        inp = self.inputs(rows=idx)
        model = self.model if idx is None else self.model.take(idx)
        occ, _, dyn = model.steady(inp)
        if idx is None:
            self.occ, self.dyn = occ, dyn
            self._settled[:] = False
        else:
            self.occ[idx] = occ
            self.dyn.u[idx], self.dyn.rho[idx], self.dyn.eta[idx] = dyn.u, dyn.rho, dyn.eta
            self._settled[idx] = False

    # ------------------------------------------------------------------ time

    def step(self, dt: float, rows: np.ndarray | None = None) -> None:
        """Advance nodes ``rows`` (None: every node) by ``dt`` seconds (one model step)."""
        sel = slice(None) if rows is None else rows
        changed = self._refresh(self.t + 0.5 * dt, rows)
        moving = changed | ~self._settled[sel]
        if moving.any():
            mv = np.flatnonzero(moving) if rows is None else rows[moving]
            every = rows is None and len(mv) == self.B
            at = None if every else mv
            # The solves read the moving nodes' rows of the whole batch's arrays in place.
            inp = self._inputs(at, whole=True)
            sol = self.model.solve(inp, self.occ, self.dyn, rows=at)
            # A node whose allocation just changed starts from its miss ratio; one whose
            # inputs drift starts where the last step's root lay relative to it.
            guess = np.where(self._moved[mv][:, None], 0.0, self._correction[mv])
            new, eta, m_end = self.model.advance(
                self.occ, inp, sol, self.dyn, dt, guess=guess, rows=at
            )
            occ = self.occ if every else self.occ[mv]
            self._correction[mv] = m_end - sol.miss_ratio
            # Settled when no way moved by a hundred-thousandth of its cache: below that,
            # the step-to-step changes are the solver's tolerance, not the workloads.
            settled = np.abs(new - occ).max(axis=(1, 2)) < self._settle_bytes[mv]
            rates = np.empty((*sol.ips.shape, COUNTERS))
            rates[..., 0] = sol.ips
            rates[..., 1] = sol.busy * (self.model.hz if every else self.model.hz[mv])
            rates[..., 2] = sol.access_rate
            rates[..., 3] = sol.miss_rate
            rates[..., 4] = sol.mem_bw
            if every:
                self.occ = new
                self.dyn = Dynamics(sol.utilization, sol.rho, eta)
                self._rates, self._service, self._rho = rates, sol.service_s, sol.rho
                self._settled = settled
            else:
                self.occ[mv] = new
                self.dyn.u[mv], self.dyn.rho[mv], self.dyn.eta[mv] = sol.utilization, sol.rho, eta
                self._rates[mv], self._service[mv], self._rho[mv] = rates, sol.service_s, sol.rho
                self._settled[mv] = settled
            self._moved[mv] = False
        self.acc[sel] += self._rates[sel] * dt
        self._account(dt, rows)
        self.t[sel] += dt

    def _account(self, dt: float, rows: np.ndarray | None) -> None:
        """One step of every LC service of nodes ``rows``: backlog, requests (drawn from
        the service's stream), and the step's record."""
        sb, si, streams = self._services()
        which = None  # every service's stream
        if rows is not None:
            keep = np.isin(sb, rows)
            sb, si, which = sb[keep], si[keep], np.flatnonzero(keep)
        if not len(sb):
            return
        rate = self.lam[sb, si] * self.act[sb, si] * dt
        rho = self._rho[sb, si]
        backlog = self.backlog[sb, si]
        if not np.count_nonzero(backlog) and rho.max() <= 1.0:
            mean = np.zeros(len(rho))  # no queue, and none builds up (fluid_backlog's zeros)
        else:
            end, mean = fluid_backlog(backlog, rho, dt)
            self.backlog[sb, si] = np.minimum(end, BACKLOG_CAP_S)
        req = streams.poisson(which, rate)
        if self.nparts[sb, si].max() >= self.parts.shape[2]:  # room for one more record
            grown = np.zeros((*self.parts.shape[:2], 2 * self.parts.shape[2], 4))
            grown[:, :, : self.parts.shape[2]] = self.parts
            self.parts = grown
        service = np.ascontiguousarray(self._service)
        record_step(sb, si, req, mean, rho, service, self.count, self.parts, self.nparts)

    def latency(
        self, groups: Sequence[tuple[int, Sequence[int]]], noisy: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """(requests (G,), p50/p95/p99/p99.9 (G, 4) in seconds) of each group ``(node,
        LC workload indices)`` since its services' last read, as a monitor would report
        them; NaN without requests. A group's sampling error is drawn from the stream of
        its first member service (in the node's service order)."""
        return self.latency_of(*self.monitored(groups), noisy=noisy)

    def monitored(self, groups: Sequence[tuple[int, Sequence[int]]]) -> LatencyGroups:
        """The member services of each group ``(node, LC workload indices)``."""
        mb: list[int] = []
        mi: list[int] = []
        owner: list[int] = []
        rngs: list[np.random.Generator | None] = []
        for g, (b, members) in enumerate(groups):
            first = None
            for s in self.lc[b]:
                if s.index in members:
                    mb.append(b)
                    mi.append(s.index)
                    owner.append(g)
                    first = first or s.rng
            rngs.append(first)
        return LatencyGroups(
            np.array(mb, dtype=np.int64),
            np.array(mi, dtype=np.int64),
            np.array(owner, dtype=np.int64),
            Streams(rngs),
        )

    def latency_of(
        self,
        mb: np.ndarray,
        mi: np.ndarray,
        owner: np.ndarray,
        rngs: list[np.random.Generator | None],
        noisy: bool = True,
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`latency` of groups given as :class:`LatencyGroups` (member services in
        group order: node ``mb``, workload ``mi``, group ``owner``; each group's stream)."""
        G = len(rngs)
        if not len(mb):
            return np.zeros(G, dtype=np.int64), np.full((G, 4), np.nan)
        counts = np.bincount(owner, weights=self.count[mb, mi], minlength=G).astype(np.int64)
        k = self.nparts[mb, mi]
        parts = np.bincount(owner, weights=k, minlength=G).astype(np.int64)
        total = int(k.sum())
        draw = rngs if noisy else [None] * G
        if not total:
            rec = np.zeros((0, 4))
            qf = np.zeros((0, len(self._tables[0].q[0]) if self._tables else 0))
            comp = (parts, rec[:, 0], rec[:, 1], rec[:, 2], qf)
            return counts, observed_many(draw, counts, *comp)
        key = None
        if total == len(mb) and np.count_nonzero(k) == total:  # one record each
            pb, pi, j = mb, mi, 0
            if total <= _POOLED_MEMO_SERVICES:
                key = self._pooled_key(pb, pi, owner, parts, draw, counts)
                pooled = self._pooled_memo.get(key)
                if pooled is not None:
                    return counts, observed_pooled(pooled, draw, counts)
        else:
            svc = np.repeat(np.arange(len(mb)), k)
            j = np.arange(total) - np.repeat(np.cumsum(k) - k, k)
            pb, pi = mb[svc], mi[svc]
        rec = self.parts[pb, pi, j]
        base = self._base[pb, pi]
        if self._table_stack is None:
            self._table_stack = TableStack(self._tables)
        qf = self._table_stack.quantiles(self._table_no[pb, pi], rec[:, 3])
        comp = (parts, rec[:, 0], base + rec[:, 1], rec[:, 2], qf)
        stall = self._stall[pb, pi]
        if stall[:, 0].any():
            # Stall share: the worker's request rate (rho / S) x stalls per request x length.
            lam_w = rec[:, 3] / np.maximum(rec[:, 2], 1e-30)
            comp = with_stalls(*comp, lam_w * stall[:, 1] * stall[:, 0], stall[:, 0])
        pooled = pooled_for_observation(draw, counts, *comp)
        if key is not None:
            if len(self._pooled_memo) >= _POOLED_MEMO_SIZE:
                self._pooled_memo.clear()
            self._pooled_memo[key] = pooled
        return counts, observed_pooled(pooled, draw, counts)

    def _pooled_key(self, pb, pi, owner, parts, draw, counts) -> tuple:
        """What the pooled quantiles of services with one step record each depend on
        besides the services themselves (their base latency, shape and stalls, fixed until
        a reset clears the memo): the grouping, the records' operating point (mean backlog,
        service time, utilisation), the request counts too where they weigh components
        against each other (a group of several services, or a stall's share), and which
        groups are noisy."""
        ids = self._pooled_ids
        if ids is None or ids[0] is not pb or ids[1] is not pi or ids[2] is not owner:
            # Fixed for these services (one record each): their bytes, and whether a group
            # pools several of them.
            ids = (pb, pi, owner, pb.tobytes() + pi.tobytes() + owner.tobytes(), parts.max() > 1)
            self._pooled_ids = ids
        rec = self.parts[pb, pi, 0]
        weighted = self._stalls or ids[4]
        noisy = noisy_groups(draw, counts, parts)
        return (ids[3], (rec if weighted else rec[:, 1:]).tobytes(), noisy.tobytes())

    def clear_latency(self, rows) -> None:
        """Forget the requests of nodes ``rows`` (a node or an index array) since the last
        read."""
        self.count[rows] = 0
        self.nparts[rows] = 0

    def steady(
        self, b: int, alloc: tuple[np.ndarray, ...], lam: Mapping[int, float]
    ) -> tuple[np.ndarray, Solution]:
        """Node ``b``'s converged occupancy and rates under ``alloc`` (its masks, ways,
        delays, caps) with LC loads ``lam`` {workload index: req/s}, others as now."""
        sub = _Single(self, b)
        inp = sub.inputs(alloc, lam)
        occ, sol, _ = sub.model.steady(inp)
        return occ, sol


class _Single:
    """A one-node view of an engine's node for steady-state solves (same parameters)."""

    def __init__(self, engine: Engine, b: int) -> None:
        self.engine, self.b = engine, b
        if engine.B == 1:
            self.model = engine.model
        else:
            self.model = engine.model.take(np.array([b]))

    def inputs(self, alloc: tuple[np.ndarray, ...], lam: Mapping[int, float]) -> Inputs:
        e, b = self.engine, self.b
        n = self.model.n
        masks, nways, delay, cap = (np.asarray(x)[None, :n] for x in alloc)
        if masks.shape[1] < n:  # a node's own arrays: pad to the engine's workloads
            grow = n - masks.shape[1]
            masks = np.pad(masks, ((0, 0), (0, grow), (0, 0)))
            nways = np.pad(nways, ((0, 0), (0, grow)), constant_values=1.0)
            delay = np.pad(delay, ((0, 0), (0, grow)))
            cap = np.pad(cap, ((0, 0), (0, grow)), constant_values=np.inf)
        if masks.shape[2] < self.model.W:
            masks = np.pad(masks, ((0, 0), (0, 0), (0, self.model.W - masks.shape[2])))
        t = float(e.t[b])
        act = np.zeros((1, n))
        act[0, : len(e.specs[b])] = e.active(b, t)
        apki_s, ws_s, cpi_s = np.ones((1, n)), np.ones((1, n)), np.ones((1, n))
        lam_a = np.zeros((1, n))
        for i in e._phased[b]:
            p = e.phase(b, i, t)
            apki_s[0, i], ws_s[0, i], cpi_s[0, i] = p.apki, p.ws, p.cpi
        for s in e.lc[b]:
            lam_a[0, s.index] = lam.get(s.index, s.schedule.level(t) * s.scale)
        total = float((self.model.threads * act).sum())
        share = min(1.0, e.presets[b].cores / total) if total > 0 else 1.0
        return Inputs(
            masks, nways, delay, cap, act, apki_s, ws_s, cpi_s, lam_a, self.model.threads * share
        )

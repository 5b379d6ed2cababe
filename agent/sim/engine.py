"""The simulated workloads of one or more nodes, stepped through time together.

An :class:`Engine` owns everything that moves with time for ``B`` nodes, each running one
scenario: which instances are active, batch phases, LC offered load, the LLC occupancy and
the model's dynamics, per-workload counters, and LC request accounting (a fluid backlog and,
per step, the request count and the parameters of the latency distribution). It knows
nothing of resctrl groups: its owner says, per workload instance, which ways it may insert
into and what MBA delay or bandwidth cap it runs under (:meth:`Engine.set_allocation`).
:class:`agent.sim.node.SimNode` owns a one-node engine; a batched simulator owns a wide one.

Randomness comes from ``numpy`` streams spawned from each node's seed at reset: one for
measurement noise and bursty load schedules, one per LC service's requests (so changing one
service's load or allocation never shifts another's draws: common random numbers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from agent.sim.catalog import MachinePreset, Phase, WorkloadSpec
from agent.sim.latency import LatencyTable, fluid_backlog, observed, table_for
from agent.sim.model import Dynamics, Inputs, Model, Solution
from agent.sim.scenario import LoadSchedule, Scenario

BACKLOG_CAP_S = 30.0  # clients time out: a queue never holds more than this much work
COUNTERS = 5  # instructions, cycles, LLC references, LLC misses, memory bytes


@dataclass
class LcService:
    """One LC instance of one node: its load, queue and the requests since the last read."""

    index: int  # workload index within the node
    schedule: LoadSchedule
    scale: float  # schedule unit -> req/s
    workers: int
    table: LatencyTable
    base_s: float  # latency outside the modelled CPU work
    rng: np.random.Generator
    capacity_rps: float  # req/s at utilisation 1, full resources alone
    backlog: float = 0.0  # fluid backlog (work seconds per worker)
    count: int = 0  # requests since the last read
    # Per step since the last read: [requests, mean backlog (s), service time (s), rho].
    parts: list[list[float]] = field(default_factory=list)

    def record(self, requests: int, backlog: float, service: float, rho: float) -> None:
        self.count += requests
        if requests == 0:
            return
        last = self.parts[-1] if self.parts else None
        if last is not None and last[1] == backlog and last[2] == service and last[3] == rho:
            last[0] += requests
        else:
            self.parts.append([float(requests), backlog, service, rho])


class Engine:
    """Workloads of ``len(scenarios)`` nodes stepped together.

    Args:
        scenarios: each node's scenario.
        seeds: each node's seed.
        solo: ``solo(preset, spec, threads) -> (IPS, CPI)`` of a workload alone with every
            way and full bandwidth (the basis of ``utilization`` loads).
    """

    def __init__(self, scenarios: Sequence[Scenario], seeds: Sequence[int], solo) -> None:
        self.scenarios = list(scenarios)
        self.B = len(self.scenarios)
        self.presets: list[MachinePreset] = []
        self.specs: list[list[WorkloadSpec]] = []
        self.threads: list[list[int]] = []
        for scn in self.scenarios:
            cat = scn.catalog
            self.presets.append(cat.machine(scn.machine))
            specs = [cat.workload(w.workload) for w in scn.workloads]
            self.specs.append(specs)
            self.threads.append(
                [w.threads or s.threads for w, s in zip(scn.workloads, specs, strict=True)]
            )
        self.model = Model(self.presets, self.specs, self.threads)
        B, n, W = self.B, self.model.n, self.model.W
        self.t = np.zeros(B)
        self.occ = np.zeros((B, n, W))
        self.dyn = self.model.start()
        self.acc = np.zeros((B, n, COUNTERS))
        self.rng: list[np.random.Generator] = []
        self.lc: list[list[LcService]] = []
        self._phased: list[list[int]] = []
        self._period: list[dict[int, float]] = []
        for b, scn in enumerate(self.scenarios):
            self._reset_node(b, scn, int(seeds[b]), solo)
        # Allocation inputs, set by the owner (default: every way, no MBA limit).
        self.masks = self.model.way_valid[:, None, :].repeat(n, axis=1).astype(float)
        self.nways = np.broadcast_to(self.model.ways, (B, n)).copy()
        self.delay = np.zeros((B, n))
        self.cap = np.full((B, n), np.inf)
        self._alloc_version = 0
        self._inp: Inputs | None = None
        self._inp_key: tuple | None = None
        self._sol: Solution | None = None
        self._settled = False
        self._settle_bytes = 1e-5 * float((self.model.way_bytes * self.model.ways).min())
        self._rates: np.ndarray | None = None

    def _reset_node(self, b: int, scn: Scenario, seed: int, solo) -> None:
        preset, specs, threads = self.presets[b], self.specs[b], self.threads[b]
        streams = np.random.SeedSequence(seed).spawn(1 + len(scn.workloads))
        rng = np.random.default_rng(streams[0])
        self.rng.append(rng)
        horizon = max(3600.0, scn.duration_s or 0.0)
        services = []
        for i, (inst, spec) in enumerate(zip(scn.workloads, specs, strict=True)):
            if spec.kind != "lc":
                continue
            lc = spec.lc
            _, cpi = solo(preset, spec, threads[i])
            svc = lc.instructions_per_request * cpi / (preset.freq_ghz * 1e9) + lc.io_ms * 1e-3
            workers = min(lc.workers, threads[i])  # never more workers than threads
            capacity = workers / svc
            scale = capacity if inst.load.unit == "utilization" else 1.0
            services.append(
                LcService(
                    index=i,
                    schedule=inst.load.schedule(rng, horizon),
                    scale=scale,
                    workers=workers,
                    table=table_for(lc.service, lc.burst),
                    base_s=lc.base_latency_ms * 1e-3,
                    rng=np.random.default_rng(streams[1 + i]),
                    capacity_rps=capacity,
                )
            )
        self.lc.append(services)
        phased = [i for i, s in enumerate(specs) if s.phases]
        self._phased.append(phased)
        self._period.append({i: sum(p.duration_s for p in specs[i].phases) for i in phased})

    # ------------------------------------------------------------------ inputs

    def set_allocation(
        self, b: int, masks: np.ndarray, nways: np.ndarray, delay: np.ndarray, cap: np.ndarray
    ) -> None:
        """Node ``b``'s per-workload masks (n x W, 0/1), ways, MBA delay and bandwidth cap."""
        n = len(self.specs[b])
        self.masks[b, :n] = masks
        self.nways[b, :n] = nways
        self.delay[b, :n] = delay
        self.cap[b, :n] = cap
        self._alloc_version += 1

    def active(self, b: int, t: float) -> list[bool]:
        return [
            w.start_s <= t and (w.end_s is None or t < w.end_s) for w in self.scenarios[b].workloads
        ]

    def phase(self, b: int, i: int, t: float) -> Phase:
        phases = self.specs[b][i].phases
        x = (t - self.scenarios[b].workloads[i].start_s) % self._period[b][i]
        for p in phases:
            if x < p.duration_s:
                return p
            x -= p.duration_s
        return phases[-1]

    def load(self, b: int, i: int, t: float) -> float:
        """Offered load (req/s) of LC workload ``i`` of node ``b`` at ``t``."""
        for s in self.lc[b]:
            if s.index == i:
                return s.schedule.level(t) * s.scale
        raise ValueError("not an LC service")

    def inputs(
        self,
        t: np.ndarray,
        lam_over: Sequence[Mapping[int, float]] | None = None,
        alloc: tuple[np.ndarray, ...] | None = None,
    ) -> Inputs:
        """Model inputs at times ``t`` (one per node). Reused, object and all, while nothing
        moved, so the step can recognise an unchanged operating point (``inp is prev``)."""
        B, n = self.B, self.model.n
        active, phases, lams = [], [], []
        for b in range(B):
            tb = float(t[b])
            active.append(tuple(self.active(b, tb)))
            phases.append(tuple(self.phase(b, i, tb) for i in self._phased[b]))
            over = lam_over[b] if lam_over else {}
            lams.append(
                tuple(over.get(s.index, s.schedule.level(tb) * s.scale) for s in self.lc[b])
            )
        key = (self._alloc_version, tuple(active), tuple(phases), tuple(lams))
        cacheable = lam_over is None and alloc is None
        if cacheable and key == self._inp_key:
            return self._inp
        act = np.zeros((B, n))
        apki_s, ws_s, cpi_s = np.ones((B, n)), np.ones((B, n)), np.ones((B, n))
        lam = np.zeros((B, n))
        for b in range(B):
            k = len(self.specs[b])
            act[b, :k] = active[b]
            for i, p in zip(self._phased[b], phases[b], strict=True):
                apki_s[b, i], ws_s[b, i], cpi_s[b, i] = p.apki, p.ws, p.cpi
            for s, rate in zip(self.lc[b], lams[b], strict=True):
                lam[b, s.index] = rate
        # Oversubscribed cores are shared: every thread gets cores / threads of one.
        total = (self.model.threads * act).sum(axis=1, keepdims=True)
        cores_total = np.array([[p.cores] for p in self.presets], dtype=float)
        share = np.minimum(1.0, cores_total / np.maximum(total, 1e-9))
        masks, nways, delay, cap = alloc or (self.masks, self.nways, self.delay, self.cap)
        inp = Inputs(
            masks, nways, delay, cap, act, apki_s, ws_s, cpi_s, lam, self.model.threads * share
        )
        if cacheable:
            prev = self._inp
            if prev is not None and self._inp_key[:3] == key[:3]:
                # Only the load moved: what depends on masks and phases carries over.
                inp.hold_cap, inp.unmask = prev.hold_cap, prev.unmask
                inp.ins_per_miss = prev.ins_per_miss
            self._inp, self._inp_key = inp, key
        return inp

    # ------------------------------------------------------------------ time

    def step(self, dt: float) -> None:
        """Advance every node by ``dt`` seconds (one model step)."""
        inp = self.inputs(self.t + 0.5 * dt)
        if self._settled and inp is self._inp_prev:
            # Nothing moved and occupancy has converged: the operating point holds.
            sol = self._sol
        else:
            sol = self.model.solve(inp, self.occ, self.dyn)
            new, eta = self.model.advance(self.occ, inp, sol, self.dyn, dt)
            # Settled when no way moved by a hundred-thousandth of its cache: below that,
            # the step-to-step changes are the solver's tolerance, not the workloads.
            self._settled = float(np.abs(new - self.occ).max(initial=0.0)) < self._settle_bytes
            self.occ = new
            self.dyn = Dynamics(sol.utilization, sol.rho, eta)
            self._sol = sol
            self._inp_prev = inp
            self._rates = None
        if self._rates is None:
            hz = self.model.hz
            self._rates = np.stack(
                [sol.ips, sol.busy * hz, sol.access_rate, sol.miss_rate, sol.mem_bw], axis=-1
            )
        self.acc += self._rates * dt
        for b in range(self.B):
            for s in self.lc[b]:
                i = s.index
                rate = float(inp.lam[b, i] * inp.active[b, i])
                rho = float(sol.rho[b, i])
                end, mean = fluid_backlog(s.backlog, rho, dt)
                s.backlog = min(end, BACKLOG_CAP_S)
                requests = int(s.rng.poisson(rate * dt)) if rate > 0 else 0
                s.record(requests, mean, float(sol.service_s[b, i]), rho)
        self.t += dt

    _inp_prev: Inputs | None = None

    def latency(self, b: int, members: Sequence[int], noisy: bool = True) -> tuple[int, np.ndarray]:
        """(requests, p50/p95/p99/p99.9 in seconds) of node ``b``'s LC workloads ``members``
        since their last read, as a monitor would report them; NaN without requests."""
        services = [s for s in self.lc[b] if s.index in members]
        count = sum(s.count for s in services)
        parts = [(s, p) for s in services for p in s.parts]
        if not parts:
            return count, np.full(4, math.nan)
        weights = np.array([p[0] for _, p in parts])
        shifts = np.array([s.base_s + p[1] for s, p in parts])
        scales = np.array([p[2] for _, p in parts])
        qfuncs = np.stack([s.table.quantiles(p[3]) for s, p in parts])
        rng = services[0].rng if noisy else None
        return count, observed(rng, int(weights.sum()), weights, shifts, scales, qfuncs)

    def clear_latency(self, b: int) -> None:
        for s in self.lc[b]:
            s.count = 0
            s.parts = []

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
            self.model = Model([engine.presets[b]], [engine.specs[b]], [engine.threads[b]])

    def inputs(self, alloc: tuple[np.ndarray, ...], lam: Mapping[int, float]) -> Inputs:
        e, b = self.engine, self.b
        n = self.model.n
        masks, nways, delay, cap = (np.asarray(x)[None, :n] for x in alloc)
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

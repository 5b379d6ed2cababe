"""SimNode: a simulated CAT/MBA server behind the same Node and Clock contract as ResctrlNode.

Groups, masks and MB values go in through ``apply`` (validated by agent.validate exactly as
a real node does, against the machine preset's capabilities); counters, occupancy, MBM
bytes and LC latency percentiles come out of ``observe``. Time is driven by ``advance``.
The model is in agent.sim.model (cache, bandwidth, MBA, CPI) and agent.sim.queueing (LC
requests); see shared/design/SIMULATOR.md and docs/SIMULATOR.md.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from agent.errors import ResourceExhausted
from agent.groups import GroupTable
from agent.sim.catalog import Catalog, MachinePreset, Phase, WorkloadSpec, default_catalog
from agent.sim.model import Inputs, Model, Solution, amd_cap_bps
from agent.sim.queueing import simulate, steady_samples, tail_mean
from agent.sim.scenario import (
    LoadSchedule,
    Scenario,
    WorkloadInstance,
    get_scenario,
)
from agent.types import (
    SLO,
    Allocation,
    AllocationPlan,
    GroupAllocation,
    GroupKind,
    GroupSample,
    GroupSpec,
    LatencyStats,
    MbaMode,
    NodeCapabilities,
    Snapshot,
)

DEFAULT_SCENARIO = "default"
PID_BASE = 10_000
# Relative 1-sigma noise per interval of each counter (perf multiplexing and skid, MBM
# sampling); occupancy is reported in units of the RMID counter's granularity.
NOISE = {
    "instructions": 0.004,
    "cycles": 0.002,
    "refs": 0.015,
    "misses": 0.02,
    "mem": 0.02,
    "occ": 0.03,
}
_NOISE_SIGMA = np.array(
    [NOISE["instructions"], NOISE["cycles"], NOISE["refs"], NOISE["misses"], NOISE["mem"]]
)
OCC_UNIT = 64 * 1024
_PERCENTILES = (50.0, 95.0, 99.0, 99.9)
_PCT_FRAC = np.array(_PERCENTILES) / 100.0
_STORE_CAP = 200_000  # latency samples kept between two observes (thinned beyond)


@dataclass(frozen=True)
class WorkloadView:
    """Where one workload instance is (simulated nodes only; controllers must not need it)."""

    name: str
    workload: str
    kind: str
    pids: tuple[int, ...]
    group: str  # the group holding most of its tasks ("" = default group)
    active: bool
    spec: WorkloadSpec = field(repr=False)
    lc_capacity_rps: float | None = None  # requests/s at utilisation 1, full resources alone
    lc_workers: int | None = None  # LC worker threads (at most its threads)


@dataclass(frozen=True)
class WorkloadTruth:
    """Noise-free steady state of one workload instance."""

    ips: float
    ipc: float
    miss_ratio: float
    mpki: float
    llc_references_per_s: float
    llc_misses_per_s: float
    bandwidth_bps: float
    occupancy_bytes: float
    slowdown: float  # vs. full resources alone (IPS for batch, service time for LC)
    load_rps: float = 0.0
    utilization: float = 0.0  # LC: per-worker utilisation
    latency_ms: Mapping[float, float] = field(default_factory=dict)  # LC percentiles
    # LC: mean latency of the requests beyond the 95th percentile (Ubik's "tail latency").
    tail95_mean_ms: float = math.nan


@dataclass(frozen=True)
class GroupTruth:
    """Noise-free steady state of a group (sums over its workloads; worst LC latency)."""

    ips: float
    ipc: float
    miss_ratio: float
    mpki: float
    bandwidth_bps: float
    occupancy_bytes: float
    slowdown: float  # the largest slowdown among its workloads
    latency_ms: Mapping[float, float]
    workloads: Mapping[str, WorkloadTruth]
    memory_latency_ns: float
    tail95_mean_ms: float = math.nan  # the largest among its LC services


_SOLO_CACHE: dict[tuple, tuple[float, float]] = {}


def solo_reference(preset: MachinePreset, spec: WorkloadSpec, threads: int) -> tuple[float, float]:
    """(IPS, CPI) of a workload alone on ``preset`` with every way and MB at maximum
    (LC services fully busy). Cached; the basis of slowdowns and of ``utilization`` loads."""
    key = (preset, spec, threads)
    if key not in _SOLO_CACHE:
        model = Model(preset, [spec], [threads])
        inp = Inputs(
            masks=np.ones((1, preset.ways)),
            nways=np.array([float(preset.ways)]),
            delay_ns=np.zeros(1),
            bw_cap=np.full(1, np.inf),
            active=np.ones(1),
            apki_s=np.ones(1),
            ws_s=np.ones(1),
            cpi_s=np.ones(1),
            lam=np.full(1, 1e30),  # saturated: every worker busy
            cores=np.array([float(min(threads, preset.cores))]),
        )
        _, sol = model.steady(inp)
        _SOLO_CACHE[key] = (float(sol.ips[0]), float(sol.cpi[0]))
    return _SOLO_CACHE[key]


def _locked(method):
    """Run a public method under the node's lock."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


def _percentiles(x: np.ndarray) -> np.ndarray:
    """np.percentile(x, (50, 95, 99, 99.9)) (linear method)."""
    y = np.sort(x)
    pos = _PCT_FRAC * (y.size - 1)
    lo = pos.astype(int)
    hi = np.minimum(lo + 1, y.size - 1)
    frac = pos - lo
    return y[lo] * (1.0 - frac) + y[hi] * frac


class SimNode:
    """A simulated server (Node + Clock). See the agent.sim package docstring for the API."""

    def __init__(
        self,
        scenario: str | Scenario = DEFAULT_SCENARIO,
        seed: int = 0,
        *,
        interval_s: float = 0.1,
        auto_groups: bool = True,
        noise: bool = True,
        max_requests: int = 1000,
        catalog: Catalog | None = None,
    ) -> None:
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s}")
        if max_requests < 10:
            raise ValueError("max_requests must be at least 10")
        self.interval_s = float(interval_s)
        self.auto_groups = auto_groups
        self.noise = noise
        self.max_requests = int(max_requests)
        self._catalog = catalog or default_catalog()
        self._seed = int(seed)
        self._closed = False
        # One caller at a time (the gRPC agent serves a node from a thread pool).
        self._lock = threading.RLock()
        self.reset(scenario, seed)

    def __getstate__(self) -> dict:
        # Picklable / deep-copyable (Ray workers, an oracle's look-ahead copies): the lock
        # is recreated, everything else (RNG state included) is copied.
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    # ================================================================== Clock

    def now(self) -> float:
        return self._t

    @_locked
    def reset(self, scenario: object | None = None, seed: int | None = None) -> None:
        if scenario is not None:
            if not isinstance(scenario, str | Scenario):
                raise TypeError(f"scenario must be a name or a Scenario, got {type(scenario)}")
            self._scenario = get_scenario(scenario, self._catalog)
        if seed is not None:
            self._seed = int(seed)
        scn = self._scenario
        cat = scn.catalog
        self._preset = cat.machine(scn.machine)
        self._caps = self._preset.capabilities()
        # Independent streams: measurement noise and load schedules, then one per LC
        # service, so one service's request count never shifts another's samples (common
        # random numbers across allocations and loads).
        streams = np.random.SeedSequence(self._seed).spawn(1 + len(scn.workloads))
        self._rng = np.random.default_rng(streams[0])
        self._req_rng = [np.random.default_rng(st) for st in streams[1:]]
        self._instances: list[WorkloadInstance] = list(scn.workloads)
        self._specs = [cat.workload(w.workload) for w in self._instances]
        threads = [
            w.threads or s.threads for w, s in zip(self._instances, self._specs, strict=True)
        ]
        self._threads = np.array(threads, dtype=float)
        self._model = Model(self._preset, self._specs, threads)
        n = len(self._instances)
        self._n = n
        # pids: one per thread, unique on this node.
        self._pids: list[tuple[int, ...]] = []
        nxt = PID_BASE
        for t in threads:
            self._pids.append(tuple(range(nxt, nxt + t)))
            nxt += t + 10
        # Own groups as resctrl would hold them on this preset: RMIDs run out too, masks
        # start contiguous unless the CPU takes sparse ones, exclusive groups on free ways.
        self._table = GroupTable(
            self._caps,
            (p for pids in self._pids for p in pids),
            rmids=self._preset.rmids,
            contiguous=not self._preset.sparse_masks,
            exclusive_free_ways=True,
        )
        # LC: load schedules (in req/s) and per-worker backlogs.
        self._lc_idx = [i for i, s in enumerate(self._specs) if s.kind == "lc"]
        self._sched: dict[int, tuple[LoadSchedule, float]] = {}
        self._capacity: dict[int, float] = {}
        self._backlog: dict[int, np.ndarray] = {}
        self._workers: dict[int, int] = {}
        horizon = max(3600.0, scn.duration_s or 0.0)
        for i in self._lc_idx:
            spec, inst = self._specs[i], self._instances[i]
            _, cpi = solo_reference(self._preset, spec, threads[i])
            svc = spec.lc.instructions_per_request * cpi / (self._preset.freq_ghz * 1e9)
            # Workers run on the instance's threads: never more workers than threads.
            self._workers[i] = min(spec.lc.workers, threads[i])
            self._capacity[i] = self._workers[i] / svc
            scale = self._capacity[i] if inst.load.unit == "utilization" else 1.0
            self._sched[i] = (inst.load.schedule(self._rng, horizon), scale)
            self._backlog[i] = np.zeros(self._workers[i])
        self._t = 0.0
        self._last_obs = 0.0
        self._acc_w = np.zeros((n, 5))  # instructions, cycles, refs, misses, mem bytes
        self._dirty_acc = False
        self._rates_of: Solution | None = None
        self._rates = np.zeros((n, 5))
        self._acc_g = np.zeros((0, 5))  # per own group, in the group table's order
        self._lat: dict[int, list[np.ndarray]] = {i: [] for i in self._lc_idx}
        self._lat_n: dict[int, int] = dict.fromkeys(self._lc_idx, 0)
        self._count: dict[int, int] = dict.fromkeys(self._lc_idx, 0)
        self._u = 0.0
        self._hz = self._preset.freq_ghz * 1e9
        self._settled = False
        self._prev_inp: Inputs | None = None
        self._inp_key: tuple | None = None
        self._inp_base: tuple | None = None
        self._inp_cache: Inputs | None = None
        self._phased = [i for i, s in enumerate(self._specs) if s.phases]
        self._period = {i: sum(p.duration_s for p in self._specs[i].phases) for i in self._phased}
        self._sol: Solution | None = None
        self._mask_rows: dict[int, np.ndarray] = {}
        self._delays: dict[int, float] = {}
        self._dirty = True
        self._topo = None
        if self.auto_groups:
            self._create_scenario_groups()
        # Start warm: caches hold their steady state for the starting allocation.
        inp = self._inputs(self._t)
        self._occ, sol = self._model.steady(inp)
        self._u = sol.utilization

    def advance(self, dt: float) -> None:
        if not (dt >= 0 and math.isfinite(dt)):
            raise ValueError(f"advance needs a finite dt >= 0, got {dt}")
        step = self.interval_s
        with self._lock:
            # Whole steps, then the remainder (counted, so long advances do not drift).
            start = self._t
            full = int(dt / step + 1e-9)
            for _ in range(full):
                self._step(step)
            rest = dt - full * step
            if rest > 1e-9 * step:
                self._step(rest)
            self._t = start + dt

    # ================================================================== Node

    def capabilities(self) -> NodeCapabilities:
        return self._caps

    def groups(self) -> Mapping[str, GroupSpec]:
        return self._table.groups()

    @_locked
    def create_group(self, spec: GroupSpec) -> None:
        self._table.create(spec, on_change=self._tasks_changing)
        self._acc_g = np.vstack([self._acc_g, np.zeros((1, 5))])

    @_locked
    def delete_group(self, name: str) -> None:
        row = self._table.delete(name, on_change=self._tasks_changing)
        self._acc_g = np.delete(self._acc_g, row, axis=0)

    @_locked
    def assign(self, group: str, *, pids: Iterable[int] = (), cpus: Iterable[int] = ()) -> None:
        self._table.assign(group, pids, cpus, on_change=self._tasks_changing)

    def tasks(self, group: str) -> frozenset[int]:
        return self._table.tasks(group)

    @_locked
    def apply(self, plan: AllocationPlan, *, dry_run: bool = False) -> Allocation:
        return self._table.apply(plan, dry_run=dry_run, on_change=self._alloc_changing)

    def allocation(self) -> Allocation:
        return self._table.allocation()

    @_locked
    def observe(self) -> Snapshot:
        self._flush()
        interval = self._t - self._last_obs
        self._last_obs = self._t
        specs = self._table.specs
        names = list(specs)
        major, frac = self._topology()
        out: dict[str, GroupSample] = {}
        if names:
            acc = self._acc_g.copy()  # (G, 5)
            self._acc_g[:] = 0.0
            occ = frac.T @ self._occ.sum(axis=1)
            if self.noise:
                z = self._rng.standard_normal((len(names), 6))
                acc = acc * np.exp(z[:, :5] * _NOISE_SIGMA)
                occ = np.maximum(occ * (1.0 + z[:, 5] * NOISE["occ"]), 0.0)
            occ = np.round(occ / OCC_UNIT) * OCC_UNIT
            lc_groups: dict[str, list[int]] = {}
            for i in self._lc_idx:
                lc_groups.setdefault(major[i], []).append(i)
            rows = acc.tolist()
            occs = occ.tolist()
            for gi, name in enumerate(names):
                r = rows[gi]
                members = lc_groups.get(name)
                latency = None
                if members or specs[name].kind is GroupKind.LC:
                    latency = self._latency_stats(members or [])
                out[name] = GroupSample(
                    instructions=r[0],
                    cycles=r[1],
                    llc_references=r[2],
                    llc_misses=r[3],
                    llc_occupancy_bytes=occs[gi],
                    memory_bytes=r[4],
                    memory_local_bytes=r[4],
                    latency=latency,
                )
        for i in self._lc_idx:
            if self._lat[i]:
                self._lat[i] = []
            self._lat_n[i] = 0
            self._count[i] = 0
        return Snapshot(timestamp=self._t, interval_s=interval, groups=out)

    def close(self) -> None:
        self._closed = True

    # ================================================================== sim-only views

    @property
    def scenario(self) -> Scenario:
        return self._scenario

    @property
    def preset(self) -> MachinePreset:
        return self._preset

    @property
    def seed(self) -> int:
        return self._seed

    def workloads(self) -> tuple[WorkloadView, ...]:
        """Which workload instance is in which group (simulated nodes only)."""
        major = self._major_groups()
        return tuple(
            WorkloadView(
                name=w.name,
                workload=w.workload,
                kind=s.kind,
                pids=self._pids[i],
                group=major[i],
                active=bool(self._active(self._t)[i]),
                spec=s,
                lc_capacity_rps=self._capacity.get(i),
                lc_workers=self._workers.get(i),
            )
            for i, (w, s) in enumerate(zip(self._instances, self._specs, strict=True))
        )

    def load_rps(self, name: str, at_s: float | None = None) -> float:
        """The offered load (req/s) of LC instance ``name`` now, or at time ``at_s`` (s)
        of the load schedule realised at reset, bursts included (an oracle's look-ahead)."""
        i = self._index(name)
        if i not in self._sched:
            raise ValueError(f"{name!r} is not an LC service")
        sched, scale = self._sched[i]
        return sched.level(self._t if at_s is None else float(at_s)) * scale

    def memory_latency_ns(self) -> float:
        return self._model.latency(self._u)

    def occupancy(self) -> dict[str, np.ndarray]:
        """Bytes each workload instance holds in each way now (a copy)."""
        return {w.name: self._occ[i].copy() for i, w in enumerate(self._instances)}

    @_locked
    def steady_state(
        self,
        plan_or_allocation: AllocationPlan | Allocation | None = None,
        load_overrides: Mapping[str, float] | None = None,
        *,
        latency_requests: int = 100_000,
    ) -> dict[str, GroupTruth]:
        """Noise-free steady state under ``plan_or_allocation`` (over the current
        allocation; None keeps it) with LC loads at ``load_overrides`` (req/s by instance
        name; others at their load now). Leaves the node's state untouched.

        Keys are own group names, plus ``""`` for the default group when it holds workloads.
        """
        alloc = dict(self._table.alloc)
        if plan_or_allocation is not None:
            plan = plan_or_allocation
            if isinstance(plan, Allocation):
                plan = plan.as_plan()
            alloc = self._table.would_hold(plan)
        lam_over = {}
        for name, rate in (load_overrides or {}).items():
            i = self._index(name)
            if i not in self._sched:
                raise ValueError(f"{name!r} is not an LC service; cannot override its load")
            if not (rate >= 0 and math.isfinite(rate)):
                raise ValueError(f"load for {name!r} must be a finite rate >= 0")
            lam_over[i] = float(rate)
        inp = self._inputs(self._t, alloc=alloc, lam_over=lam_over)
        occ, sol = self._model.steady(inp)
        return self._truths(inp, occ, sol, alloc, latency_requests)

    # ================================================================== internals

    def _index(self, name: str) -> int:
        for i, w in enumerate(self._instances):
            if w.name == name:
                return i
        raise KeyError(f"no workload instance {name!r} in scenario {self._scenario.name!r}")

    def _create_scenario_groups(self) -> None:
        for i, (w, s) in enumerate(zip(self._instances, self._specs, strict=True)):
            gname = w.group_name
            if not gname:
                continue
            if gname not in self._table.specs:
                if s.kind == "lc":
                    target = w.slo_ms or s.lc.slo_ms
                    spec = GroupSpec(gname, GroupKind.LC, SLO(s.lc.slo_percentile, target))
                else:
                    spec = GroupSpec(gname, GroupKind.BATCH)
                try:
                    self.create_group(spec)
                except ResourceExhausted:
                    continue  # more services than CLOSIDs: the rest stay in the default group
            self.assign(gname, pids=self._pids[i])

    def _tasks_changing(self) -> None:
        """Before groups are created or deleted or tasks move: counters so far go to the
        groups that held the tasks, and model inputs and topology are recomputed after."""
        self._flush()
        self._dirty = True
        self._topo = None

    def _alloc_changing(self) -> None:
        """Before an allocation changes: the same, but tasks stay where they are."""
        self._flush()
        self._dirty = True

    def _major_groups(self) -> list[str]:
        return self._topology()[0]

    def _fractions(self) -> np.ndarray:
        """(n workloads x own groups): the share of each workload's threads in each group."""
        return self._topology()[1]

    def _topology(self) -> tuple[list[str], np.ndarray]:
        if self._topo is None:
            self._topo = (self._compute_major(), self._compute_fractions())
        return self._topo

    def _compute_major(self) -> list[str]:
        return [self._table.majority_group(pids) for pids in self._pids]

    def _compute_fractions(self) -> np.ndarray:
        task_group = self._table.task_group
        idx = {g: j for j, g in enumerate(self._table.specs)}
        frac = np.zeros((self._n, len(idx)))
        for i, pids in enumerate(self._pids):
            share = 1.0 / len(pids)
            for p in pids:
                j = idx.get(task_group[p])
                if j is not None:
                    frac[i, j] += share
        return frac

    def _flush(self) -> None:
        """Move per-workload counters into the groups holding the tasks now."""
        if self._dirty_acc:
            if self._table.specs:
                self._acc_g += self._fractions().T @ self._acc_w
            self._acc_w[:] = 0.0
            self._dirty_acc = False

    def _active(self, t: float) -> np.ndarray:
        return np.array(
            [w.start_s <= t and (w.end_s is None or t < w.end_s) for w in self._instances],
            dtype=float,
        )

    def _inputs(
        self,
        t: float,
        alloc: Mapping[str, GroupAllocation] | None = None,
        lam_over: Mapping[int, float] | None = None,
    ) -> Inputs:
        """Model inputs at time ``t``. The allocation part is cached until tasks or
        allocations change, and the whole object is reused while nothing moved (the
        step's fast path compares ``inp is prev``)."""
        fresh = alloc is not None or self._dirty
        if alloc is None and not self._dirty:
            base = self._base
        else:
            base = self._alloc_inputs(self._table.alloc if alloc is None else alloc)
            if alloc is None:
                self._base, self._dirty = base, False
        insts = self._instances
        active = tuple(w.start_s <= t and (w.end_s is None or t < w.end_s) for w in insts)
        phases = tuple(self._phase(i, t) for i in self._phased)
        lam = tuple(
            lam_over[i] if lam_over and i in lam_over else sched.level(t) * scale
            for i, (sched, scale) in self._sched.items()
        )
        key = (active, phases, lam)
        if not fresh and lam_over is None and base is self._inp_base and key == self._inp_key:
            return self._inp_cache
        n = self._n
        act = np.array(active, dtype=float)
        apki_s = np.ones(n)
        ws_s = np.ones(n)
        cpi_s = np.ones(n)
        for i, p in zip(self._phased, phases, strict=True):
            apki_s[i], ws_s[i], cpi_s[i] = p.apki, p.ws, p.cpi
        lam_a = np.zeros(n)
        if lam:
            lam_a[list(self._sched)] = lam
        total = float(self._threads @ act)
        share = min(1.0, self._preset.cores / total) if total > 0 else 1.0
        masks, nways, delay, cap = base
        inp = Inputs(
            masks, nways, delay, cap, act, apki_s, ws_s, cpi_s, lam_a, self._threads * share
        )
        if alloc is None and lam_over is None:
            self._inp_key, self._inp_cache, self._inp_base = key, inp, base
        return inp

    def _phase(self, i: int, t: float) -> Phase:
        phases = self._specs[i].phases
        x = (t - self._instances[i].start_s) % self._period[i]
        for p in phases:
            if x < p.duration_s:
                return p
            x -= p.duration_s
        return phases[-1]

    def _alloc_inputs(self, alloc: Mapping[str, GroupAllocation]):
        preset, n, W = self._preset, self._n, self._preset.ways
        major = self._major_groups()
        masks = np.zeros((n, W))
        nways = np.zeros(n)
        delay = np.zeros(n)
        cap = np.full(n, np.inf)
        mba = self._caps.mba
        members: dict[str, int] = {}
        for g in major:
            members[g] = members.get(g, 0) + 1
        for i, g in enumerate(major):
            a = alloc.get(g) if g else None
            mask = preset.cbm_mask if a is None or a.l3_mask is None else a.l3_mask
            if a is not None and a.l3_code_mask is not None:
                mask |= a.l3_code_mask
            row = self._mask_rows.get(mask)
            if row is None:
                row = self._mask_rows[mask] = np.array([(mask >> j) & 1 for j in range(W)], float)
            masks[i] = row
            nways[i] = max(1.0, row.sum())
            if mba is not None:
                mb = mba.max_bandwidth if a is None or a.mb is None else a.mb
                if mba.mode is MbaMode.PERCENT:
                    d = self._delays.get(mb)
                    if d is None:
                        d = self._delays[mb] = preset.mba_delay(int(mb))
                    delay[i] = d
                elif mba.mode is MbaMode.AMD and mb < mba.max_bandwidth:
                    cap[i] = amd_cap_bps(mb) / members[g]
                elif mba.mode is MbaMode.MBPS:
                    cap[i] = float(mb) * (1 << 20) / members[g]
        return masks, nways, delay, cap

    def _step(self, dt: float) -> None:
        inp = self._inputs(self._t + 0.5 * dt)
        same = self._settled and inp is self._prev_inp
        if same:
            # Nothing moved and occupancy has converged: the operating point holds.
            sol = self._sol
        else:
            sol = self._model.solve(inp, self._occ, self._u)
            self._u = sol.utilization
            new = self._model.advance_occupancy(self._occ, inp, sol, dt)
            self._settled = float(np.abs(new - self._occ).max(initial=0.0)) < 1.0
            self._occ = new
            self._sol = sol
            self._prev_inp = inp
        hz = self._hz
        if self._rates_of is not sol:
            # Counter rates per workload: instructions, cycles, refs, misses, memory bytes.
            self._rates = np.stack(
                [sol.ips, sol.busy * hz, sol.access_rate, sol.miss_rate, sol.mem_bw], axis=1
            )
            self._rates_of = sol
        self._acc_w += self._rates * dt
        self._dirty_acc = True
        for i in self._lc_idx:
            rate = inp.lam[i] * inp.active[i]
            lat, count, self._backlog[i] = simulate(
                self._req_rng[i],
                rate,
                float(sol.service_s[i]),
                self._specs[i].lc.service,
                self._backlog[i],
                dt,
                self.max_requests,
            )
            if lat.size:
                self._lat[i].append(lat)
                self._lat_n[i] += lat.size
                if self._lat_n[i] > _STORE_CAP:
                    self._lat[i] = [x[::2] for x in self._lat[i]]
                    self._lat_n[i] = sum(x.size for x in self._lat[i])
            self._count[i] += count
        self._t += dt

    def _latency_stats(self, members: list[int]) -> LatencyStats:
        arrays = [x for i in members for x in self._lat[i]]
        count = sum(self._count[i] for i in members)
        if not arrays:
            return LatencyStats(count, *([math.nan] * 4)) if count else LatencyStats.empty()
        lat = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
        p = _percentiles(lat) * 1e3
        return LatencyStats(count, float(p[0]), float(p[1]), float(p[2]), float(p[3]))

    def _truths(
        self,
        inp: Inputs,
        occ: np.ndarray,
        sol: Solution,
        alloc: Mapping[str, GroupAllocation],
        latency_requests: int,
    ) -> dict[str, GroupTruth]:
        hz = self._preset.freq_ghz * 1e9
        major = self._major_groups()
        per_w: dict[int, WorkloadTruth] = {}
        occ_w = occ.sum(axis=1)
        for i, s in enumerate(self._specs):
            ips_ref, cpi_ref = solo_reference(self._preset, s, int(self._threads[i]))
            ips = float(sol.ips[i])
            lat: dict[float, float] = {}
            util = 0.0
            rate = 0.0
            if s.kind == "lc":
                rate = float(inp.lam[i] * inp.active[i])
                svc = float(sol.service_s[i])
                util = rate * svc / self._workers[i]
                workers = self._workers[i]
                if rate <= 0:
                    ps, tail = (svc,) * len(_PERCENTILES), svc
                elif util >= 1.0:
                    ps, tail = (math.inf,) * len(_PERCENTILES), math.inf
                else:
                    samples = steady_samples(rate, svc, s.lc.service, workers, latency_requests)
                    ps, tail = tuple(np.percentile(samples, _PERCENTILES)), tail_mean(samples)
                lat = {p: float(v) * 1e3 for p, v in zip(_PERCENTILES, ps, strict=True)}
                tail_ms = tail * 1e3
                slowdown = float(sol.cpi[i]) / cpi_ref
            else:
                slowdown = ips_ref / ips if ips > 0 else math.inf
                tail_ms = math.nan
            busy_cycles = float(sol.busy[i]) * hz
            per_w[i] = WorkloadTruth(
                ips=ips,
                ipc=ips / busy_cycles if busy_cycles > 0 else 0.0,
                miss_ratio=float(sol.miss_ratio[i]),
                mpki=float(sol.miss_rate[i] / ips * 1000.0) if ips > 0 else 0.0,
                llc_references_per_s=float(sol.access_rate[i]),
                llc_misses_per_s=float(sol.miss_rate[i]),
                bandwidth_bps=float(sol.mem_bw[i]),
                occupancy_bytes=float(occ_w[i]),
                slowdown=slowdown,
                load_rps=rate,
                utilization=util,
                latency_ms=MappingProxyType(lat),
                tail95_mean_ms=tail_ms,
            )
        out: dict[str, GroupTruth] = {}
        for g in [*alloc, ""]:
            members = [i for i in range(self._n) if major[i] == g]
            if g == "" and not members:
                continue
            ips = sum(per_w[i].ips for i in members)
            cyc = sum(float(sol.busy[i]) * hz for i in members)
            refs = sum(per_w[i].llc_references_per_s for i in members)
            miss = sum(per_w[i].llc_misses_per_s for i in members)
            lat: dict[float, float] = {}
            for i in members:
                for p, v in per_w[i].latency_ms.items():
                    lat[p] = max(lat.get(p, 0.0), v)
            out[g] = GroupTruth(
                ips=ips,
                ipc=ips / cyc if cyc > 0 else 0.0,
                miss_ratio=miss / refs if refs > 0 else 0.0,
                mpki=miss / ips * 1000.0 if ips > 0 else 0.0,
                bandwidth_bps=sum(per_w[i].bandwidth_bps for i in members),
                occupancy_bytes=sum(per_w[i].occupancy_bytes for i in members),
                slowdown=max((per_w[i].slowdown for i in members), default=1.0),
                latency_ms=MappingProxyType(lat),
                workloads=MappingProxyType({self._instances[i].name: per_w[i] for i in members}),
                memory_latency_ns=sol.latency_ns,
                tail95_mean_ms=max(
                    (per_w[i].tail95_mean_ms for i in members if self._specs[i].kind == "lc"),
                    default=math.nan,
                ),
            )
        return out

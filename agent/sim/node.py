"""SimNode: a simulated CAT/MBA server behind the same Node and Clock contract as ResctrlNode.

Groups, masks and MB values go in through ``apply`` (validated by agent.validate exactly as
a real node does, against the machine preset's capabilities); counters, occupancy, MBM
bytes and LC latency percentiles come out of ``observe``. Time is driven by ``advance``.
The node keeps the group side (agent.groups.GroupTable: specs, allocations, tasks) and the
measurement side (counters split among groups, noise); the workloads themselves are a
one-node :class:`agent.sim.engine.Engine` (model: agent.sim.model, LC latency:
agent.sim.latency), and ground truth is agent.sim.truth. Equations: docs/SIMULATOR.md.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from agent.errors import Interrupted
from agent.groups import GroupTable
from agent.node import StepByParts
from agent.sim.batch import (
    MbaRule,
    MbaRules,
    group_counters,
    instance_slo,
    measured,
    scenario_groups,
    thread_pids,
    workload_allocation,
)
from agent.sim.catalog import Catalog, MachinePreset, WorkloadSpec, default_catalog
from agent.sim.engine import COUNTERS, Engine, LatencyGroups, _Single
from agent.sim.scenario import Scenario, WorkloadInstance, get_scenario
from agent.sim.truth import GroupTruth, solo_reference, truths
from agent.types import (
    SLO,
    Allocation,
    AllocationPlan,
    GroupAllocation,
    GroupKind,
    GroupSample,
    GroupSpec,
    LatencyStats,
    NodeCapabilities,
    Snapshot,
    new_sample,
)

DEFAULT_SCENARIO = "default"


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
    slo: SLO | None = None  # an LC service's own SLO (the scenario's ``slo_ms`` applied)


def _locked(method):
    """Run a public method under the node's lock."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


class SimNode(StepByParts):
    """A simulated server (Node + Clock). See the agent.sim package docstring for the API.

    Args:
        scenario: a scenario name from the library, a YAML path, or a :class:`Scenario`.
        seed: seeds every random stream of the node (noise, load bursts, requests).
        interval_s: the model's time step; ``advance`` integrates in steps of this length.
        auto_groups: create the scenario's groups at reset and move its tasks there.
        noise: measurement noise on counters and occupancy (LC latencies keep the
            sampling error of the interval's requests: that is the workload, not the
            measurement).
        catalog: presets, workloads and scenarios (default: the shipped catalog).
    """

    NEVER_BLOCKS = True  # computation only: the agent serves it on its event loop

    def __init__(
        self,
        scenario: str | Scenario = DEFAULT_SCENARIO,
        seed: int = 0,
        *,
        interval_s: float = 0.1,
        auto_groups: bool = True,
        noise: bool = True,
        catalog: Catalog | None = None,
    ) -> None:
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s}")
        self.interval_s = float(interval_s)
        self.auto_groups = auto_groups
        self.noise = noise
        self._catalog = catalog or default_catalog()
        self._seed = int(seed)
        self._closed = False
        self._interrupted = False  # set from another thread by interrupt(): a bool is enough
        # One caller at a time: in-process users may share a node between threads (the
        # agent calls it on its event loop, but Advance and scrapes run in worker threads).
        self._lock = threading.RLock()
        self.reset(scenario, seed)

    def __getstate__(self) -> dict:
        # Picklable / deep-copyable (Ray workers, an oracle's look-ahead copies): the lock
        # is recreated, everything else (RNG state included) is copied.
        state = self.__dict__.copy()
        del state["_lock"]
        state["_lat"] = None  # rebuilt from the copy's own engine on its first observe
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_lat", None)  # a node pickled before the view was kept
        self._lock = threading.RLock()

    # ================================================================== Clock

    def now(self) -> float:
        return self._t

    def _scenario_and_seed(self, scenario: object | None, seed: int | None) -> tuple:
        """The scenario and seed a reset would start, checked; the current ones by default."""
        scn = getattr(self, "_scenario", None)
        if scenario is not None:
            if not isinstance(scenario, str | Scenario):
                raise TypeError(f"scenario must be a name or a Scenario, got {type(scenario)}")
            scn = get_scenario(scenario, self._catalog)
        seed = self._seed if seed is None else int(seed)
        if seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed}")
        return scn, seed

    @_locked
    def reset(self, scenario: object | None = None, seed: int | None = None) -> None:
        scn, seed = self._scenario_and_seed(scenario, seed)
        # Built before anything is assigned: a refused scenario or seed (the engine's
        # SeedSequence takes no negative one) leaves the node as it was.
        engine = Engine([scn], [seed], solo_reference)
        self._scenario, self._seed, self._engine = scn, seed, engine
        self._preset = self._engine.presets[0]
        self._caps = self._preset.capabilities()
        self._instances: list[WorkloadInstance] = list(scn.workloads)
        self._specs = self._engine.specs[0]
        self._threads = self._engine.threads[0]
        self._n = len(self._instances)
        # pids: one per thread, unique on this node.
        self._pids: list[tuple[int, ...]] = thread_pids(self._threads)
        # Own groups as resctrl would hold them on this preset: RMIDs run out too, masks
        # start contiguous unless the CPU takes sparse ones, exclusive groups on free ways.
        self._table = GroupTable(
            self._caps,
            (p for pids in self._pids for p in pids),
            rmids=self._preset.rmids,
            contiguous=not self._preset.sparse_masks,
            exclusive_free_ways=True,
        )
        self._lc = {s.index: s for s in self._engine.lc[0]}
        self._rng = self._engine.rng[0]
        self._t = 0.0
        self._last_obs = 0.0
        self._dirty_acc = False
        self._acc_g = np.zeros((0, COUNTERS))  # per own group, in the group table's order
        self._mba_rules = MbaRules.of([MbaRule.of(self._preset, self._caps)])
        self._topo = None
        self._lat = None  # (topology, latency-reporting groups, their monitored services)
        self._topo_version = 0  # counts task/group changes (what _sync_allocation keys on)
        self._alloc_key: tuple | None = None
        if self.auto_groups:
            self._create_scenario_groups()
        self._sync_allocation()
        # Start warm: caches hold their steady state for the starting allocation.
        self._engine.warm()

    def advance(self, dt: float) -> None:
        if not (dt >= 0 and math.isfinite(dt)):
            raise ValueError(f"advance needs a finite dt >= 0, got {dt}")
        step = self.interval_s
        with self._lock:
            self._sync_allocation()
            # Whole steps, then the remainder (counted, so long advances do not drift).
            start, done = self._t, 0
            full = int(dt / step + 1e-9)
            rest = dt - full * step
            try:
                for _ in range(full):
                    self._check_interrupted(dt)
                    self._engine.step(step)
                    done += 1
                if rest > 1e-9 * step:
                    self._check_interrupted(dt)
                    self._engine.step(rest)
                self._t = start + dt
            except Interrupted:
                self._t = start + done * step  # the last whole step simulated
                raise
            finally:
                self._engine.t[0] = self._t
                self._dirty_acc = True

    def interrupt(self) -> None:
        """The agent is stopping: an advance running in another thread ends after the step
        it is simulating (Interrupted), and later ones do not start, so the node lock is
        soon free for restore-on-exit and the process can exit within its grace period."""
        self._interrupted = True

    def _check_interrupted(self, dt: float) -> None:
        if self._interrupted:
            raise Interrupted(
                f"interrupted: the agent is stopping (an advance of {dt:g} s, stopped at "
                "the last whole simulator step)"
            )

    # ================================================================== Node

    def capabilities(self) -> NodeCapabilities:
        return self._caps

    def groups(self) -> Mapping[str, GroupSpec]:
        return self._table.groups()

    @_locked
    def create_group(self, spec: GroupSpec) -> None:
        self._table.create(spec, on_change=self._tasks_changing)
        self._acc_g = np.vstack([self._acc_g, np.zeros((1, COUNTERS))])

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
        return self._table.apply(plan, dry_run=dry_run, on_change=self._flush)

    def allocation(self) -> Allocation:
        return self._table.allocation()

    def reserved_ways(self) -> Mapping[int, int]:
        """None: a simulated node runs no other tool."""
        return {}

    @_locked
    def observe(self) -> Snapshot:
        self._flush()
        interval = self._t - self._last_obs
        self._last_obs = self._t
        specs = self._table.specs
        names = list(specs)
        frac = self._topology()[1]
        out: dict[str, GroupSample] = {}
        if names:
            acc = self._acc_g.copy()  # (G, 5)
            self._acc_g[:] = 0.0
            occ = group_counters(frac[None], self._engine.occ[:1, : self._n].sum(axis=-1))[0]
            z = self._rng.standard_normal((len(names), 6)) if self.noise else None
            acc, occ = measured(acc, occ, z)
            lat_names, monitored = self._latency_view()
            counts, pct = self._engine.latency_of(*monitored)
            latency = dict(zip(lat_names, _latency_stats(counts, pct), strict=True))
            rows = acc.tolist()
            occs = occ.tolist()
            for gi, name in enumerate(names):
                r = rows[gi]
                out[name] = new_sample(
                    r[0], r[1], r[2], r[3], occs[gi], r[4], r[4], latency.get(name)
                )
        self._engine.clear_latency(0)
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

    @_locked
    def reseed(self, seed: int | Sequence[int]) -> None:
        """GroundTruth.reseed: the measurement noise and the LC services' request streams
        continue from ``seed``'s streams; occupancy, queues, time and the load schedules
        (a bursty load's bursts included) stay as they are."""
        self._engine.reseed(0, seed)

    def workloads(self) -> tuple[WorkloadView, ...]:
        """Which workload instance is in which group (simulated nodes only)."""
        major = self._topology()[0]
        active = self._engine.active(0, self._t)
        return tuple(
            WorkloadView(
                name=w.name,
                workload=w.workload,
                kind=s.kind,
                pids=self._pids[i],
                group=major[i],
                active=active[i],
                spec=s,
                lc_capacity_rps=self._lc[i].capacity_rps if i in self._lc else None,
                lc_workers=self._lc[i].workers if i in self._lc else None,
                slo=instance_slo(w, s),
            )
            for i, (w, s) in enumerate(zip(self._instances, self._specs, strict=True))
        )

    def load_rps(self, name: str, at_s: float | None = None) -> float:
        """The offered load (req/s) of LC instance ``name`` now, or at time ``at_s`` (s)
        of the load schedule realised at reset, bursts included (an oracle's look-ahead)."""
        i = self._index(name)
        if i not in self._lc:
            raise ValueError(f"{name!r} is not an LC service")
        return self._engine.load(0, i, self._t if at_s is None else float(at_s))

    def memory_latency_ns(self) -> float:
        return float(self._engine.model.latency(self._engine.dyn.u)[0])

    def occupancy(self) -> dict[str, np.ndarray]:
        """Bytes each workload instance holds in each way now (a copy)."""
        W = self._preset.ways
        return {w.name: self._engine.occ[0, i, :W].copy() for i, w in enumerate(self._instances)}

    @_locked
    def steady_state(
        self,
        plan_or_allocation: AllocationPlan | Allocation | None = None,
        load_overrides: Mapping[str, float] | None = None,
    ) -> dict[str, GroupTruth]:
        """Noise-free steady state under ``plan_or_allocation`` (over the current
        allocation; None keeps it) with LC loads at ``load_overrides`` (req/s by instance
        name; others at their load now). Leaves the node's state untouched.

        Keys are own group names, plus ``""`` for the default group when it holds workloads.
        LC latency percentiles come from the latency tables (deterministic).
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
            if i not in self._lc:
                raise ValueError(f"{name!r} is not an LC service; cannot override its load")
            if not (rate >= 0 and math.isfinite(rate)):
                raise ValueError(f"load for {name!r} must be a finite rate >= 0")
            lam_over[i] = float(rate)
        arrays = self._alloc_arrays(alloc)
        occ, sol = self._engine.steady(0, arrays, lam_over)
        inp = _Single(self._engine, 0).inputs(arrays, lam_over)
        return truths(
            self._preset,
            self._specs,
            [w.name for w in self._instances],
            self._threads,
            inp,
            occ,
            sol,
            self._topology()[0],
            list(alloc),
        )

    # ================================================================== internals

    def _index(self, name: str) -> int:
        for i, w in enumerate(self._instances):
            if w.name == name:
                return i
        raise KeyError(f"no workload instance {name!r} in scenario {self._scenario.name!r}")

    def _create_scenario_groups(self) -> None:
        scenario_groups(
            self._instances,
            self._specs,
            self._pids,
            lambda: self._table.specs,
            self.create_group,
            lambda g, pids: self.assign(g, pids=pids),
        )

    def _tasks_changing(self) -> None:
        """Before groups are created or deleted or tasks move: counters so far go to the
        groups that held the tasks; topology and model inputs are recomputed after."""
        self._flush()
        self._topo = None
        self._topo_version += 1

    def _topology(self) -> tuple[list[str], np.ndarray]:
        """(the group holding most of each workload's tasks, the (workloads x own groups)
        share of each workload's threads in each group)."""
        if self._topo is None:
            task_group = self._table.task_group
            idx = {g: j for j, g in enumerate(self._table.specs)}
            frac = np.zeros((self._n, len(idx)))
            for i, pids in enumerate(self._pids):
                share = 1.0 / len(pids)
                for p in pids:
                    j = idx.get(task_group[p])
                    if j is not None:
                        frac[i, j] += share
            major = [self._table.majority_group(pids) for pids in self._pids]
            self._topo = (major, frac)
        return self._topo

    def _latency_view(self) -> tuple[list[str], LatencyGroups]:
        """(the groups that report latency: those holding an LC service or of kind LC,
        their member services as the engine monitors them). Fixed until tasks move or
        groups change (a new topology), so built once per topology, not per observe."""
        topo = self._topology()
        view = self._lat
        if view is None or view[0] is not topo:
            major, specs = topo[0], self._table.specs
            lc_groups: dict[str, list[int]] = {}
            for i in self._lc:
                lc_groups.setdefault(major[i], []).append(i)
            names = [g for g in specs if lc_groups.get(g) or specs[g].kind is GroupKind.LC]
            monitored = self._engine.monitored([(0, lc_groups.get(g, [])) for g in names])
            view = self._lat = (topo, names, monitored)
        return view[1], view[2]

    def _flush(self) -> None:
        """Move per-workload counters into the groups holding the tasks now."""
        if self._dirty_acc:
            acc = self._engine.acc[0, : self._n]
            if self._table.specs:
                self._acc_g += group_counters(self._topology()[1][None], acc[None])[0]
            acc[:] = 0.0
            self._dirty_acc = False

    def _sync_allocation(self) -> None:
        """Hand the engine each workload's mask, MBA delay and cap when they changed."""
        key = (self._topo_version, dict(self._table.alloc))
        if key == self._alloc_key:
            return
        self._engine.set_allocation(0, *self._alloc_arrays(self._table.alloc), moved=True)
        self._alloc_key = key

    def _alloc_arrays(self, alloc: Mapping[str, GroupAllocation]) -> tuple[np.ndarray, ...]:
        """(masks n x W, ways, MBA delay ns, bandwidth cap bytes/s) per workload: each runs
        with the allocation of the group holding most of its threads."""
        major = self._topology()[0]
        cbm = self._preset.cbm_mask
        col = {g: j for j, g in enumerate(alloc)}
        gmask = np.zeros((1, max(len(alloc), 1)), dtype=np.int64)
        gmb = np.full((1, max(len(alloc), 1)), np.nan)
        for j, a in enumerate(alloc.values()):
            mask = cbm if a.l3_mask is None else a.l3_mask
            gmask[0, j] = mask | (a.l3_code_mask or 0)
            gmb[0, j] = np.nan if a.mb is None else a.mb
        group_of = np.array([[col[g] if g and g in col else -1 for g in major]], dtype=np.int64)
        masks, nways, delay, cap = workload_allocation(
            group_of, gmask, gmb, np.array([cbm]), self._mba_rules, self._engine.model.W
        )
        return masks[0], nways[0], delay[0], cap[0]


def compile_kernels() -> None:
    """Compile every kernel a node's calls run (or load them from numba's cache): a
    throwaway node of the default scenario is stepped with a moving allocation, observed
    over one step and over several (whose latency pools a mixture) and asked its steady
    state. A served node calls this before it listens: on a fresh install the first
    ``advance`` and ``observe`` would otherwise compile for some seconds inside a
    client's first call, past its deadline. Milliseconds once the cache holds them."""
    node = SimNode(DEFAULT_SCENARIO)
    for ways, steps in ((2, 1), (3, 3)):  # an interval of one step, and one of a moving few
        plan = {g: GroupAllocation(l3_mask=(1 << ways) - 1) for g in node.groups()}
        node.apply(AllocationPlan.uniform(plan))
        node.advance(steps * node.interval_s)
        node.observe()
    node.steady_state()
    node.close()


def _latency_stats(counts: np.ndarray, pct: np.ndarray) -> list[LatencyStats]:
    """LatencyStats of groups from the engine's request counts and percentiles (s)."""
    out = []
    for count, p in zip(counts.tolist(), (pct * 1e3).tolist(), strict=True):
        out.append(LatencyStats(count, p[0], p[1], p[2], p[3]) if count else LatencyStats.empty())
    return out

"""SimBatch: many simulated nodes stepped as one array pass, for training at scale.

Each node is what a :class:`agent.sim.node.SimNode` with ``auto_groups=True`` is: a
scenario on a machine preset, its workloads in the groups the scenario names (LC groups
with their SLOs; groups beyond the CLOSIDs left out), counters split among groups,
seeded measurement noise and LC latency percentiles. The workloads of all nodes are one
:class:`agent.sim.engine.Engine` (the same model code SimNode runs with one node), and the
group side is arrays over (nodes, groups) instead of a :class:`agent.groups.GroupTable`
per node: groups never change within an episode here, and allocations come from a policy
whose plans are valid by construction (the env checks them against SimNode in tests).

The group-side rules live here once and SimNode calls them too: which groups a scenario
creates (:func:`scenario_groups`), how a group allocation becomes each workload's mask,
MBA delay or bandwidth cap (:func:`workload_allocation`), and what a monitor reads
(:func:`group_counters`, :func:`measured`). docs/SIMULATOR.md has the model; docs/TRAINING.md
how the vector environment uses this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from agent.compiled import jit as _jit
from agent.errors import ResourceExhausted
from agent.groups import GroupTable
from agent.sim import kernel
from agent.sim.catalog import MachinePreset, WorkloadSpec
from agent.sim.engine import COUNTERS, Engine, describe
from agent.sim.kernel import MBA_AMD, MBA_MBPS, MBA_NONE, MBA_PERCENT
from agent.sim.scenario import Scenario, WorkloadInstance
from agent.sim.truth import solo_reference
from agent.types import (
    SLO,
    AllocationPlan,
    GroupAllocation,
    GroupKind,
    GroupSpec,
    MbaMode,
    NodeCapabilities,
)

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
NOISE_SIGMA = np.array(
    [NOISE["instructions"], NOISE["cycles"], NOISE["refs"], NOISE["misses"], NOISE["mem"]]
)
OCC_UNIT = 64 * 1024
_MODES = {MbaMode.PERCENT: MBA_PERCENT, MbaMode.AMD: MBA_AMD, MbaMode.MBPS: MBA_MBPS}


# ---------------------------------------------------------------------------- shared rules


def thread_pids(threads: Sequence[int]) -> list[tuple[int, ...]]:
    """Simulated pids of each workload instance: one per thread, unique on the node."""
    out, nxt = [], PID_BASE
    for t in threads:
        out.append(tuple(range(nxt, nxt + t)))
        nxt += t + 10
    return out


def instance_slo(w: WorkloadInstance, s: WorkloadSpec) -> SLO | None:
    """An LC instance's SLO: its workload's, with the scenario's ``slo_ms`` target where
    it sets one (None for a batch job)."""
    if s.kind != "lc" or s.lc is None:
        return None
    return SLO(s.lc.slo_percentile, w.slo_ms or s.lc.slo_ms)


def scenario_groups(
    instances: Sequence[WorkloadInstance],
    specs: Sequence[WorkloadSpec],
    pids: Sequence[tuple[int, ...]],
    existing: Callable[[], object],
    create: Callable[[GroupSpec], None],
    assign: Callable[[str, tuple[int, ...]], None],
) -> None:
    """Create the groups a scenario names and move each instance's tasks there, as an
    operator's config would: one group per instance (or per ``group`` name), LC groups of
    kind LC with the SLO; a group that does not fit (``ResourceExhausted``: CLOSIDs or
    RMIDs) is skipped and its workloads stay in the default group."""
    for i, (w, s) in enumerate(zip(instances, specs, strict=True)):
        gname = w.group_name
        if not gname:
            continue
        if gname not in existing():
            if s.kind == "lc":
                spec = GroupSpec(gname, GroupKind.LC, instance_slo(w, s))
            else:
                spec = GroupSpec(gname, GroupKind.BATCH)
            try:
                create(spec)
            except ResourceExhausted:
                continue  # more services than CLOSIDs: the rest stay in the default group
        assign(gname, pids[i])


@dataclass(frozen=True)
class MbaRule:
    """How a node turns MB values into workload inputs: mode, maximum, and (percent mode)
    the MBA delay of every MB value 0..maximum."""

    mode: int
    max_bw: float
    delay: np.ndarray  # (levels,) ns; empty unless percent mode

    @classmethod
    def of(cls, preset: MachinePreset, caps: NodeCapabilities) -> MbaRule:
        key = (preset.name, preset)
        got = _RULES.get(key)
        if got is None:
            mba = caps.mba
            if mba is None:
                got = cls(MBA_NONE, np.nan, np.zeros(0))
            else:
                mode = _MODES[mba.mode]
                delay = np.zeros(0)
                if mode == MBA_PERCENT:
                    delay = np.array(
                        [preset.mba_delay(v) for v in range(int(mba.max_bandwidth) + 1)]
                    )
                got = cls(mode, float(mba.max_bandwidth), delay)
            _RULES[key] = got
        return got


_RULES: dict[tuple, MbaRule] = {}


@dataclass(frozen=True)
class MbaRules:
    """Nodes' :class:`MbaRule` as the arrays :func:`workload_allocation` reads: modes (N,),
    maxima (N,) and percent-mode delays (N, levels), built once per set of rules."""

    modes: np.ndarray
    max_bw: np.ndarray
    delays: np.ndarray

    @classmethod
    def of(cls, rules: Sequence[MbaRule]) -> MbaRules:
        delays = np.zeros((len(rules), max([len(r.delay) for r in rules] + [1])))
        for b, r in enumerate(rules):
            delays[b, : len(r.delay)] = r.delay
        return cls(
            np.array([r.mode for r in rules], dtype=np.int64),
            np.array([r.max_bw for r in rules], dtype=float),
            delays,
        )

    def take(self, rows: np.ndarray) -> MbaRules:
        return MbaRules(self.modes[rows], self.max_bw[rows], self.delays[rows])


def workload_allocation(
    group_of: np.ndarray,
    gmask: np.ndarray,
    gmb: np.ndarray,
    cbm: np.ndarray,
    rules: MbaRules,
    W: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each workload's (mask rows (N, n, W), ways, MBA delay ns, bandwidth cap bytes/s) on
    N nodes: a workload runs with the allocation of the group holding most of its threads
    (:func:`kernel.workload_allocation`).

    Args:
        group_of: (N, n) that group's column, -1 for the default group (every way, MB
            maximum) and for padding.
        gmask: (N, G) each group's capacity bitmask (code mask ORed in; the node's full
            mask where the group has none).
        gmb: (N, G) each group's MB value (NaN: none, i.e. the maximum).
        cbm: (N,) each node's full capacity bitmask.
        rules: the nodes' MBA rules.
    """
    return kernel.workload_allocation(
        np.ascontiguousarray(group_of, dtype=np.int64),
        np.ascontiguousarray(gmask, dtype=np.int64),
        np.ascontiguousarray(gmb, dtype=float),
        np.ascontiguousarray(cbm, dtype=np.int64),
        rules.modes,
        rules.max_bw,
        rules.delays,
        W,
    )


_PAD = -2  # group_of of padding workloads (no node has them): not counted anywhere


def group_counters(frac: np.ndarray, per_workload: np.ndarray) -> np.ndarray:
    """Per-workload values (N, n, ...) summed into groups by thread share ``frac`` (N, n, G)."""
    if per_workload.ndim == 2:
        return np.einsum("nwg,nw->ng", frac, per_workload)
    return group_sums(
        np.ascontiguousarray(frac, dtype=float), np.ascontiguousarray(per_workload, dtype=float)
    )


@_jit
def group_sums(frac, per_workload):
    """Per-workload rows ``per_workload`` (N, n, K) summed into groups by thread share
    ``frac`` (N, n, G): (N, G, K), each sum taken over the workloads in their order, so the
    numbers are ``np.einsum("nwg,nwk->ngk", ...)``'s (a fifth of its time at a batch's
    sizes, where einsum's general loop dominates)."""
    N, n, G = frac.shape
    K = per_workload.shape[2]
    out = np.zeros((N, G, K))
    for b in range(N):
        for w in range(n):
            for g in range(G):
                f = frac[b, w, g]
                for k in range(K):
                    out[b, g, k] += f * per_workload[b, w, k]
    return out


@_jit
def take_draws(buf, rows, cur, need, width):
    """Row ``r``: the ``need[r]`` draws of ``buf[rows[r]]`` from ``cur[r]`` on, then zeros
    to ``width`` (R, width): what each node's observation takes of its block of draws."""
    R = rows.shape[0]
    out = np.zeros((R, width))
    for r in range(R):
        b, c = rows[r], cur[r]
        for k in range(need[r]):
            out[r, k] = buf[b, c + k]
    return out


def measured(
    acc: np.ndarray, occ: np.ndarray, z: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """(counters, occupancy) a monitor reports for true group counters ``acc`` (..., 5) and
    occupancy ``occ`` (...): multiplied by ``exp(N(0, sigma))`` per counter (``z``: standard
    normal draws (..., 6), None without noise), occupancy with 3% noise, rounded to the RMID
    counter's granularity."""
    if z is not None:
        acc = acc * np.exp(z[..., :5] * NOISE_SIGMA)
        occ = np.maximum(occ * (1.0 + z[..., 5] * NOISE["occ"]), 0.0)
    return acc, np.rint(occ / OCC_UNIT) * OCC_UNIT  # np.round's value, without its wrapper


# ---------------------------------------------------------------------------- the batch


_ALLOCATOR_TUNED = False


def keep_freed_blocks() -> None:
    """Ask glibc's malloc to keep freed blocks of up to 64 MB in the process instead of
    returning them to the kernel. A batch step's numpy temporaries are around a megabyte
    each; by default glibc unmaps such blocks on free and the next step faults their pages
    in again, which doubled the time of pooling LC latency (measured: 22 -> 12 ms for 300
    groups of five steps). Process-wide and idempotent; a no-op off glibc."""
    global _ALLOCATOR_TUNED
    if _ALLOCATOR_TUNED:
        return
    _ALLOCATOR_TUNED = True
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 64 << 20)
    mallopt(m_trim_threshold, 256 << 20)


@dataclass
class GroupReadings:
    """What the groups of N nodes measured over their last interval, as arrays (groups in
    each node's creation order, padded; see :class:`SimBatch`).

    Attributes:
        timestamp, interval_s: (N,) end of the interval and its length.
        counters: (N, G, 5) instructions, cycles, LLC references, LLC misses, memory bytes.
        occupancy: (N, G) LLC occupancy bytes.
        latency_count: (N, G) requests of the interval (NaN: the group reports no latency).
        latency_ms: (N, G, 4) p50, p95, p99, p99.9 (NaN without requests).
    """

    timestamp: np.ndarray
    interval_s: np.ndarray
    counters: np.ndarray
    occupancy: np.ndarray
    latency_count: np.ndarray
    latency_ms: np.ndarray


class SimBatch:
    """N simulated nodes stepped together (see the module docstring).

    Args:
        scenarios, seeds: each node's scenario and seed (as ``SimNode(scenario, seed)``).
        interval_s: the model's time step; ``advance`` integrates in steps of this length.
        noise: measurement noise on counters and occupancy.
        max_workloads, max_ways, max_groups: room for the largest scenario later resets
            may bring (default: the largest of ``scenarios``).
    """

    def __init__(
        self,
        scenarios: Sequence[Scenario],
        seeds: Sequence[int],
        *,
        interval_s: float = 0.1,
        noise: bool = True,
        max_workloads: int | None = None,
        max_ways: int | None = None,
        max_groups: int | None = None,
    ) -> None:
        if not scenarios or len(scenarios) != len(seeds):
            raise ValueError("one scenario and one seed per node (at least one node)")
        keep_freed_blocks()
        self.interval_s = float(interval_s)
        self.noise = bool(noise)
        described = [describe(s) for s in scenarios]
        n = max([len(d[1]) for d in described] + [max_workloads or 1])
        W = max([d[0].ways for d in described] + [max_ways or 1])
        knees = max(len(w.knees) for s in scenarios for w in s.catalog.workloads.values())
        self.engine = Engine(scenarios, seeds, solo_reference, n=n, W=W, knees=knees)
        N = self.N = len(scenarios)
        G = self.G = max(max_groups or 1, n)
        self.t = np.zeros(N)
        self.last_obs = np.zeros(N)
        self.acc = np.zeros((N, G, COUNTERS))
        self.frac = np.zeros((N, n, G))  # share of each workload's threads in each group
        self.group_of = np.full((N, n), _PAD)
        self.gmask = np.zeros((N, G), dtype=np.int64)
        self.gmb = np.full((N, G), np.nan)
        self.cbm = np.zeros(N, dtype=np.int64)
        self.ngroups = np.zeros(N, dtype=np.int64)
        self.rules: list[MbaRule] = [None] * N  # type: ignore[list-item]
        self._rule_arrays: MbaRules | None = None  # the rules as arrays: after a reset, anew
        self.caps: list[NodeCapabilities] = [None] * N  # type: ignore[list-item]
        self.group_specs: list[list[GroupSpec]] = [[] for _ in range(N)]
        self.tables: list[GroupTable] = [None] * N  # type: ignore[list-item]
        # LC groups of each node: (column, LC workload indices) of groups reporting latency
        self._lat_groups: list[list[tuple[int, list[int]]]] = [[] for _ in range(N)]
        self._monitor = None
        # measurement noise drawn ahead (see _noise): a block of each node's stream
        self._zbuf = np.zeros((N, max(4096, 12 * G)))
        self._zcur = np.full(N, self._zbuf.shape[1], dtype=np.int64)
        self._setup(range(N))

    # ------------------------------------------------------------------ reset

    @property
    def scenarios(self) -> list[Scenario]:
        return self.engine.scenarios

    def presets(self) -> list[MachinePreset]:
        return self.engine.presets

    def reset(
        self, rows: Sequence[int], scenarios: Sequence[Scenario], seeds: Sequence[int]
    ) -> None:
        """Start nodes ``rows`` afresh (time 0, their groups created, caches warm), as
        ``SimNode.reset(scenario, seed)``."""
        rows = [int(b) for b in rows]
        self.engine.reset_nodes(rows, scenarios, seeds)
        self._setup(rows)

    def _setup(self, rows: Sequence[int]) -> None:
        rows = list(rows)
        if not rows:
            return
        e = self.engine
        idx = np.array(rows)
        for arr, value in (
            (self.t, 0.0),
            (self.last_obs, 0.0),
            (self.acc, 0.0),
            (self.frac, 0.0),
            (self.group_of, _PAD),
            (self.gmask, 0),
            (self.gmb, np.nan),
            (self._zcur, self._zbuf.shape[1]),  # the node's stream restarts: nothing ahead
        ):
            arr[idx] = value
        for b in rows:
            preset, specs, threads = e.presets[b], e.specs[b], e.threads[b]
            caps = preset.capabilities()
            pids = thread_pids(threads)
            table = GroupTable(
                caps,
                (p for ps in pids for p in ps),
                rmids=preset.rmids,
                contiguous=not preset.sparse_masks,
                exclusive_free_ways=True,
            )
            scenario_groups(
                e.scenarios[b].workloads,
                specs,
                pids,
                lambda t=table: t.specs,
                table.create,
                lambda g, p, t=table: t.assign(g, pids=p),
            )
            names = list(table.specs)
            if len(names) > self.G:
                raise ValueError(f"node {b}: {len(names)} groups, room for {self.G}")
            col = {g: j for j, g in enumerate(names)}
            lat: dict[int, list[int]] = {}
            for i, ps in enumerate(pids):
                g = table.majority_group(ps)
                self.group_of[b, i] = col[g] if g else -1
                if g:
                    self.frac[b, i, col[g]] = 1.0
                if specs[i].kind == "lc" and g:
                    lat.setdefault(col[g], []).append(i)
            for name, spec in table.specs.items():
                if spec.kind is GroupKind.LC:
                    lat.setdefault(col[name], [])
            self._lat_groups[b] = sorted(lat.items())
            self.caps[b] = caps
            self.rules[b] = MbaRule.of(preset, caps)
            self._rule_arrays = None
            self.cbm[b] = caps.l3.cbm_mask if caps.l3 is not None else (1 << preset.ways) - 1
            self.group_specs[b] = [table.specs[g] for g in names]
            self.tables[b] = table
            self.ngroups[b] = len(names)
            for j, g in enumerate(names):
                a = table.alloc[g]
                mask = self.cbm[b] if a.l3_mask is None else a.l3_mask
                self.gmask[b, j] = mask | (a.l3_code_mask or 0)
                self.gmb[b, j] = np.nan if a.mb is None else a.mb
        self._push(idx, True)
        e.warm(idx)
        self._monitor = None  # the flat list of LC groups is rebuilt on next use

    def _noise(self, idx: np.ndarray) -> np.ndarray:
        """Each node's measurement-noise draws for one observation, (len(idx), G, 6): node
        ``b`` takes the next ``6 * groups`` standard normals of its stream, as a SimNode
        draws ``standard_normal((groups, 6))``. After its reset nothing else draws from that
        stream, so the draws are taken ahead in blocks (one call per node per block, not per
        observation) and give the same numbers."""
        need = 6 * self.ngroups[idx]
        size = self._zbuf.shape[1]
        cur = self._zcur[idx]
        for r in np.flatnonzero(cur + need > size).tolist():
            b = int(idx[r])
            left = self._zbuf[b, cur[r] :].copy()
            self._zbuf[b, : len(left)] = left
            self._zbuf[b, len(left) :] = self.engine.rng[b].standard_normal(size - len(left))
            self._zcur[b] = cur[r] = 0
        z = take_draws(self._zbuf, np.asarray(idx, dtype=np.int64), cur, need, 6 * self.G)
        self._zcur[idx] = cur + need
        return z.reshape(len(idx), self.G, 6)

    def _monitored(self, rows: np.ndarray | None):
        """(node, column, LatencyGroups) of the groups reporting latency on nodes ``rows``
        (None: all), in node order."""
        if self._monitor is None:
            pairs = [(b, c, m) for b in range(self.N) for c, m in self._lat_groups[b]]
            lat = self.engine.monitored([(b, m) for b, _, m in pairs])
            node = np.array([p[0] for p in pairs], dtype=np.int64)
            col = np.array([p[1] for p in pairs], dtype=np.int64)
            self._monitor = (node, col, lat)
        node, col, lat = self._monitor
        if rows is None:
            return node, col, lat
        keep = np.isin(node, rows)
        members = keep[lat.owner]
        renumber = np.cumsum(keep) - 1
        sub = type(lat)(
            lat.mb[members],
            lat.mi[members],
            renumber[lat.owner[members]],
            lat.rngs.take(np.flatnonzero(keep)),
        )
        return node[keep], col[keep], sub

    # ------------------------------------------------------------------ allocation

    def set_allocation(
        self, rows: np.ndarray, gmask: np.ndarray, gmb: np.ndarray, moved: np.ndarray
    ) -> None:
        """Groups' capacity masks (N', G) and MB values (NaN: none) for nodes ``rows``;
        ``moved`` (N',) says whose allocation changed (the others keep their operating
        point, as a SimNode does when an apply changes nothing)."""
        rows = np.asarray(rows)
        self.gmask[rows] = gmask
        self.gmb[rows] = gmb
        moved = np.asarray(moved, dtype=bool)
        if moved.any():
            self._push(rows[moved], True)

    def apply(self, b: int, plan: AllocationPlan) -> None:
        """Apply ``plan`` to node ``b`` as ``SimNode.apply`` does (validated against the
        node's capabilities, all-or-nothing; fields a plan leaves None are kept). The slow
        path, for a baseline or a controller's plan; a policy's arrays go through
        :meth:`set_allocation`."""
        self.apply_many([b], [plan])

    def apply_many(self, rows: Sequence[int], plans: Sequence[AllocationPlan]) -> None:
        """:meth:`apply` ``plans[k]`` to node ``rows[k]`` for every k, the workloads'
        allocations recomputed once for all of them (episodes starting together). Each plan
        is all-or-nothing on its node; an invalid one raises after the plans before it
        took effect, as the same :meth:`apply` calls in turn would leave them."""
        done: list[int] = []
        moved: list[bool] = []
        try:
            for b, plan in zip(rows, plans, strict=True):
                moved.append(self._apply_table(int(b), plan))
                done.append(int(b))
        finally:
            if done:
                at = np.array(done)
                self.set_allocation(at, self.gmask[at], self.gmb[at], np.array(moved))

    def _apply_table(self, b: int, plan: AllocationPlan) -> bool:
        """Validate and apply ``plan`` on node ``b``'s group table and write the groups'
        masks and MB values into the arrays; whether any changed."""
        table = self.tables[b]
        names = list(table.specs)
        for j, g in enumerate(names):  # what the arrays hold now
            old = table.alloc[g]
            mask = None if old.l3_mask is None else int(self.gmask[b, j])
            mb = None if np.isnan(self.gmb[b, j]) else int(self.gmb[b, j])
            table.alloc[g] = GroupAllocation(l3_mask=mask, mb=mb, l3_code_mask=old.l3_code_mask)
        table.apply(plan)
        gmask, gmb = self.gmask[b].copy(), self.gmb[b].copy()
        for j, g in enumerate(names):
            a = table.alloc[g]
            mask = self.cbm[b] if a.l3_mask is None else a.l3_mask
            gmask[j] = mask | (a.l3_code_mask or 0)
            gmb[j] = np.nan if a.mb is None else a.mb
        moved = not (
            np.array_equal(gmask, self.gmask[b])
            and np.array_equal(gmb, self.gmb[b], equal_nan=True)
        )
        self.gmask[b], self.gmb[b] = gmask, gmb
        return moved

    def _push(self, rows: np.ndarray, moved) -> None:
        if self._rule_arrays is None:
            self._rule_arrays = MbaRules.of(self.rules)
        masks, nways, delay, cap = workload_allocation(
            self.group_of[rows],
            self.gmask[rows],
            self.gmb[rows],
            self.cbm[rows],
            self._rule_arrays.take(rows),
            self.engine.model.W,
        )
        self.engine.set_allocation(rows, masks, nways, delay, cap, moved=moved)

    # ------------------------------------------------------------------ time

    def advance(self, dt: float, rows: np.ndarray | None = None) -> None:
        """Let ``dt`` seconds pass on nodes ``rows`` (None: all), in steps of interval_s."""
        step = self.interval_s
        full = int(dt / step + 1e-9)
        for _ in range(full):
            self.engine.step(step, rows)
        rest = dt - full * step
        if rest > 1e-9 * step:
            self.engine.step(rest, rows)
        sel = slice(None) if rows is None else rows
        self.t[sel] += dt
        self.engine.t[sel] = self.t[sel]

    def observe(self, rows: np.ndarray | None = None) -> GroupReadings:
        """What nodes ``rows`` (None: all) measured since their last observation."""
        e = self.engine
        idx = np.arange(self.N) if rows is None else np.asarray(rows)
        acc = self.acc[idx] + group_counters(self.frac[idx], e.acc[idx])
        e.acc[idx] = 0.0
        self.acc[idx] = 0.0
        interval = self.t[idx] - self.last_obs[idx]
        self.last_obs[idx] = self.t[idx]
        occ = group_counters(self.frac[idx], e.occ[idx].sum(axis=-1))
        z = self._noise(idx) if self.noise else None
        acc, occ = measured(acc, occ, z)
        count = np.full((len(idx), self.G), np.nan)
        pct = np.full((len(idx), self.G, 4), np.nan)
        node, col, lat = self._monitored(None if rows is None else idx)
        if len(node):
            n, p = e.latency_of(*lat)
            at = node if rows is None else np.searchsorted(idx, node, sorter=np.argsort(idx))
            if rows is not None:
                at = np.argsort(idx)[at]
            count[at, col] = n
            pct[at, col] = p * 1e3
        e.clear_latency(idx)
        return GroupReadings(self.t[idx].copy(), interval, acc, occ, count, pct)

"""A trace-driven simulated node: the recorded load replayed through fitted dynamics.

``TraceNode`` is a :class:`agent.node.Node` and :class:`agent.node.Clock` built from a
recorded trace: each recorded group
becomes a workload with a few simulated pids; its LC load (completed requests/s) and
whether it ran are replayed from the trace over time (looping at its end), and its
counters come from :class:`training.dynamics.Dynamics` evaluated under whatever
allocation the node holds *now* — not the logged one (docs/RL.md, the CausalSim caveat). Plans
are validated with agent/validate.py like every backend, so it passes the Node contract
and can be the node of ``envs``' ``NodePartitionEnv(node=TraceNode(...))``.

Simplifications (docs/TRACES.md): one domain's allocation drives the model (plans are
uniform across domains in practice); latency percentiles of a group over an observation
are the request-weighted mean of its per-step predictions; noise is log-normal with each
target's fitted residual spread.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from agent.groups import GroupTable
from agent.node import StepByParts
from agent.types import (
    Allocation,
    AllocationPlan,
    GroupAllocation,
    GroupSample,
    GroupSpec,
    LatencyStats,
    NodeCapabilities,
    Snapshot,
)
from training.dynamics import LATENCY_KEYS, Dynamics, effective_ways, fit_dynamics
from training.traces import Trace

PID_BASE = 50_000
THREADS = 2


@dataclass(frozen=True)
class Replay:
    """What a trace says about load over time: per recorded group, per interval, the LC
    load (req/s) and whether the group ran."""

    times: np.ndarray  # end of each interval, s since the trace's start
    load: Mapping[str, np.ndarray]
    active: Mapping[str, np.ndarray]

    @classmethod
    def from_trace(cls, trace: Trace) -> Replay:
        if not trace.steps:
            raise ValueError(f"trace {trace.path} has no intervals to replay")
        t0 = trace.steps[0].snapshot.timestamp - trace.steps[0].snapshot.interval_s
        times = np.array([s.snapshot.timestamp - t0 for s in trace.steps])
        load, ran = {}, {}
        for g in trace.groups:
            lv, av = [], []
            for s in trace.steps:
                sample = s.snapshot.groups.get(g)
                h = s.snapshot.interval_s
                lat = sample.latency if sample is not None else None
                lv.append(lat.count / h if lat is not None and h > 0 else 0.0)
                av.append(sample is not None and bool(sample.instructions))
            load[g], ran[g] = np.array(lv), np.array(av)
        return cls(times, load, ran)

    @property
    def duration_s(self) -> float:
        return float(self.times[-1])

    def at(self, t: float) -> tuple[dict[str, float], set[str]]:
        """(load per group, active groups) in the interval holding ``t`` (looping)."""
        t = t % self.duration_s if self.duration_s > 0 else 0.0
        i = min(int(np.searchsorted(self.times, t, side="left")), len(self.times) - 1)
        return (
            {g: float(v[i]) for g, v in self.load.items()},
            {g for g, v in self.active.items() if v[i]},
        )


class TraceNode(StepByParts):
    """A Node + Clock replaying a trace through fitted dynamics (see the module docstring).

    Args:
        dynamics: the fitted response (:func:`training.dynamics.fit_dynamics`).
        replay: the recorded load over time (:meth:`Replay.from_trace`).
        seed: seeds noise and the start offset.
        interval_s: model step (the trace's interval by default).
        auto_groups: on reset, create the recorded groups and move their pids there.
        noise: add log-normal noise with the fitted residual spread.
        random_start: start each reset at a seeded random point of the replay.
    """

    def __init__(
        self,
        dynamics: Dynamics,
        replay: Replay,
        seed: int = 0,
        *,
        interval_s: float = 0.1,
        auto_groups: bool = True,
        noise: bool = True,
        random_start: bool = False,
    ) -> None:
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s}")
        self.dynamics = dynamics
        self.replay = replay
        self.interval_s = float(interval_s)
        self.auto_groups = auto_groups
        self.noise = noise
        self.random_start = random_start
        self._caps: NodeCapabilities = replace(
            dynamics.capabilities,
            simulated=True,
            description=f"trace-driven ({dynamics.capabilities.description or 'node'})",
        )
        self._workloads = list(dynamics.groups)
        self._pids = {
            w: tuple(range(PID_BASE + 100 * i, PID_BASE + 100 * i + THREADS))
            for i, w in enumerate(self._workloads)
        }
        self._owner = {p: w for w, ps in self._pids.items() for p in ps}
        self._seed = int(seed)
        self.reset(None, seed)

    @classmethod
    def from_trace(cls, trace: Trace, seed: int = 0, **kwargs) -> TraceNode:
        kwargs.setdefault("interval_s", trace.interval_s or 0.1)
        return cls(fit_dynamics(trace), Replay.from_trace(trace), seed, **kwargs)

    # ================================================================== Clock

    def now(self) -> float:
        return self._t

    def reset(self, scenario: object | None = None, seed: int | None = None) -> None:
        if scenario is not None:
            raise ValueError("a TraceNode replays its own trace; build another for another one")
        if seed is not None:
            self._seed = int(seed)
        self._rng = np.random.default_rng(self._seed)
        self._offset = (
            float(self._rng.uniform(0.0, self.replay.duration_s)) if self.random_start else 0.0
        )
        self._t = 0.0
        self._phase = 0.0  # how far into a recorded interval the occupancy state is
        self._last_obs = 0.0
        # New groups start on a contiguous run unless the recorded CPU takes sparse masks:
        # a mask the recorded machine would refuse must not appear in a replayed allocation.
        l3 = self._caps.l3
        self._table = GroupTable(
            self._caps, self._owner, contiguous=l3 is not None and not l3.sparse_masks
        )
        self._acc: dict[str, np.ndarray] = {}  # workload -> instr, cycles, refs, misses, bytes
        self._lat: dict[str, np.ndarray] = {}  # workload -> count, weighted p50..p999
        self._occ: dict[str, float] = {}
        self._eff: dict[str, float] | None = None
        self._state: dict[str, float] | None = None  # occupancy shares (the model's state)
        self._bw: dict[str, float] = {}  # last step's bandwidth: the fixed point's start
        for w in self._workloads:
            self._acc[w] = np.zeros(5)
            self._lat[w] = np.zeros(1 + len(LATENCY_KEYS))
            self._occ[w] = 0.0
        if self.auto_groups:
            for w in self._workloads:
                self.create_group(self.dynamics.groups[w].spec)
                self.assign(w, pids=self._pids[w])

    def advance(self, dt: float) -> None:
        if not (dt >= 0 and math.isfinite(dt)):
            raise ValueError(f"advance needs a finite dt >= 0, got {dt}")
        remaining = float(dt)
        while remaining > 1e-12:
            h = self.interval_s if remaining > self.interval_s * (1 + 1e-9) else remaining
            self._step(h)
            remaining -= h

    # ================================================================== Node

    def capabilities(self) -> NodeCapabilities:
        return self._caps

    def groups(self) -> Mapping[str, GroupSpec]:
        return self._table.groups()

    def create_group(self, spec: GroupSpec) -> None:
        self._table.create(spec)

    def delete_group(self, name: str) -> None:
        self._table.delete(name)

    def assign(self, group: str, *, pids: Iterable[int] = (), cpus: Iterable[int] = ()) -> None:
        self._table.assign(group, pids, cpus)

    def tasks(self, group: str) -> frozenset[int]:
        return self._table.tasks(group)

    def apply(self, plan: AllocationPlan, *, dry_run: bool = False) -> Allocation:
        return self._table.apply(plan, dry_run=dry_run)

    def allocation(self) -> Allocation:
        return self._table.allocation()

    def reserved_ways(self) -> Mapping[int, int]:
        """None: a replayed trace has no other tool on the node."""
        return {}

    def observe(self) -> Snapshot:
        interval = self._t - self._last_obs
        self._last_obs = self._t
        out: dict[str, GroupSample] = {}
        for name, spec in self._table.specs.items():
            members = [w for w in self._workloads if self._group_of(w) == name]
            acc = sum((self._acc[w] for w in members), np.zeros(5))
            lat = sum((self._lat[w] for w in members), np.zeros(1 + len(LATENCY_KEYS)))
            latency = None
            if spec.slo is not None or any(self.dynamics.groups[w].max_load_rps for w in members):
                if lat[0] > 0:
                    latency = LatencyStats(round(lat[0]), *(lat[1:] / lat[0]))
                else:
                    latency = LatencyStats.empty()
            out[name] = GroupSample(
                instructions=float(acc[0]),
                cycles=float(acc[1]),
                llc_references=float(acc[2]),
                llc_misses=float(acc[3]),
                llc_occupancy_bytes=float(sum(self._occ[w] for w in members)),
                memory_bytes=float(acc[4]),
                memory_local_bytes=float(acc[4]),
                latency=latency,
            )
        for w in self._workloads:
            self._acc[w][:] = 0.0
            self._lat[w][:] = 0.0
        return Snapshot(timestamp=self._t, interval_s=interval, groups=out)

    def close(self) -> None:
        pass

    # ================================================================== internals

    def _group_of(self, workload: str) -> str:
        return self._table.majority_group(self._pids[workload])

    def _workload_alloc(self, w: str) -> GroupAllocation:
        g = self._group_of(w)
        held = self._table.alloc
        if g in held:
            return held[g]
        caps = self._caps  # the default group: every way, full bandwidth
        return GroupAllocation(
            caps.l3.cbm_mask if caps.l3 else None, caps.mba.max_bandwidth if caps.mba else None
        )

    def _step(self, h: float) -> None:
        # The occupancy state moves one recorded interval per transition (it was fitted on
        # them), so transitions happen at the recording's rate whatever the model step: a
        # step is cut where a recorded interval ends, and a step that ends inside one
        # carries the part it covered over to the next.
        rec = self.dynamics.interval_s
        left = h
        while left > 1e-12 * max(h, 1.0):
            to_boundary = (1.0 - self._phase) * rec
            piece = min(left, to_boundary)
            ends = piece >= to_boundary * (1.0 - 1e-9)
            self._phase = 0.0 if ends else self._phase + piece / rec
            self._substep(piece, ends)
            left -= piece

    def _substep(self, h: float, transition: bool = True) -> None:
        """``h`` seconds at the occupancy state held; ``transition``: a recorded interval
        ends with them, and the state moves to its end (else the occupancy gauge moves the
        share of the way the interval has gone, ``self._phase``)."""
        loads, active = self.replay.at(self._offset + self._t + h / 2)
        act = [w for w in self._workloads if w in active]
        allocs = {w: self._workload_alloc(w) for w in self._workloads}
        eff = self._effective_ways(h, allocs, act)
        if self._state is None:  # start settled under the allocation held at the start
            settled = self.dynamics.predict(
                {w: eff[w] for w in act}, {w: allocs[w].mb for w in act}, loads
            )
            self._state = {w: p.occupancy_share for w, p in settled.items()}
            self._bw = {w: p.bw_bps for w, p in settled.items()}
        pred = self.dynamics.predict(
            {w: eff[w] for w in act},
            {w: allocs[w].mb for w in act},
            loads,
            iterations=1,
            occupancy={w: self._state.get(w, 0.0) for w in act},
            bw_start=self._bw,
        )
        self._bw = {w: p.bw_bps for w, p in pred.items()}
        for w in self._workloads:
            p = pred.get(w)
            if p is None:
                # an idle workload's lines get evicted: half of them per recorded interval
                decay = 0.5 ** (h / self.dynamics.interval_s)
                self._occ[w] *= decay
                if w in self._state:
                    self._state[w] *= decay
                continue
            d = self.dynamics.groups[w]
            z = self._noise(d)
            ips = p.ips * z["ipc"]
            self._acc[w] += h * np.array(
                [
                    ips,
                    p.cycles_rate,
                    p.refs_rate * z["ipc"] * z["apki"],
                    p.miss_rate * z["ipc"] * z["mpki"],
                    p.bw_bps * z["bw"],
                ]
            )
            if transition:
                self._state[w] = p.occupancy_share
            if transition or not d.state:
                self._occ[w] = p.occupancy_bytes
            else:
                start = self._state.get(w, p.occupancy_share)
                share = start + (p.occupancy_share - start) * self._phase
                self._occ[w] = share * self.dynamics.cache_bytes
            if len(p.latency_ms) == len(LATENCY_KEYS) and loads.get(w, 0.0) > 0:
                n = loads[w] * h
                self._lat[w] += np.array([n, *(n * p.latency_ms[k] * z[k] for k in LATENCY_KEYS)])
        self._t += h

    def _effective_ways(self, h: float, allocs: dict, act: list[str]) -> dict[str, float]:
        """Each workload's effective ways after ``h`` seconds: the allocation's, reached
        at its fitted time constant (settled at the start)."""
        target = effective_ways({w: a.l3_mask for w, a in allocs.items()}, self._caps, act)
        if self._eff is None:
            self._eff = dict(target)
        for w in self._workloads:
            tau = self.dynamics.groups[w].tau_s
            a = math.exp(-h / tau) if tau > 0 else 0.0
            self._eff[w] = target[w] + (self._eff[w] - target[w]) * a
        return dict(self._eff)

    def _noise(self, d) -> dict[str, float]:
        keys = ("ipc", "apki", "mpki", "bw", *LATENCY_KEYS)
        if not self.noise:
            return dict.fromkeys(keys, 1.0)
        out = {}
        for k in keys:
            reg = d.models.get(k)
            sigma = reg.sigma if reg is not None else 0.0
            out[k] = float(np.exp(self._rng.normal(0.0, sigma) - sigma * sigma / 2))
        return out

"""A small in-memory Node for the server tests while (or where) no backend is available.

Not a mock of anything under test: it is a complete, if featureless, Node (kernel rules via
agent.validate, real pids from /proc) that passes the same contract suite locally
(test_refnode.py), so a failure through RemoteNode points at the gRPC layer.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Mapping

from agent.errors import (
    GroupExists,
    GroupNotFound,
    InvalidCpus,
    InvalidName,
    InvalidPid,
    ResourceExhausted,
    UnknownTask,
)
from agent.node import StepByParts
from agent.types import (
    Allocation,
    AllocationPlan,
    CacheCapabilities,
    GroupAllocation,
    GroupSample,
    GroupSpec,
    LatencyStats,
    MbaCapabilities,
    MonitoringCapabilities,
    NodeCapabilities,
    Snapshot,
    Vendor,
    validate_group_name,
)
from agent.validate import PlanContext, validate_plan

CAPS = NodeCapabilities(
    vendor=Vendor.SIMULATED,
    num_cpus=4,
    l3=CacheCapabilities(cbm_mask=0x7FF, min_cbm_bits=2, num_closids=16, domains=(0, 1)),
    mba=MbaCapabilities(
        min_bandwidth=10, bandwidth_gran=10, max_bandwidth=100, num_closids=8, domains=(0, 1)
    ),
    monitoring=MonitoringCapabilities(
        num_rmids=32, features=frozenset({"llc_occupancy"}), domains=(0, 1)
    ),
    description="reference node (tests)",
)


class RefNode(StepByParts):
    """Groups, tasks and allocations in memory; time is whatever ``tick`` says."""

    def __init__(self, caps: NodeCapabilities = CAPS) -> None:
        self.caps = caps
        self._specs: dict[str, GroupSpec] = {}
        self._alloc: dict[str, dict[int, GroupAllocation]] = {}
        self._tasks: dict[str, set[int]] = {}
        self._created = 0  # each creation its own generation
        self._t = 0.0
        self._last = 0.0
        self._lock = threading.Lock()
        # ways another tool holds exclusively (a test sets them): plans overlapping them
        # are refused, as a real node refuses them
        self.reserved: dict[int, int] = {}

    def tick(self, seconds: float) -> None:
        self._t += seconds

    def capabilities(self) -> NodeCapabilities:
        return self.caps

    def groups(self):
        return dict(self._specs)

    def create_group(self, spec: GroupSpec) -> None:
        validate_group_name(spec.name, error=InvalidName)
        if spec.name in self._specs:
            raise GroupExists(spec.name)
        if len(self._specs) + 1 >= self.caps.num_closids:
            raise ResourceExhausted("no CLOSID left", resource="closid")
        self._created += 1
        self._specs[spec.name] = dataclasses.replace(spec, generation=self._created)
        full = GroupAllocation(l3_mask=self.caps.l3.cbm_mask, mb=self.caps.mba.max_bandwidth)
        self._alloc[spec.name] = dict.fromkeys(self.caps.domains, full)
        self._tasks[spec.name] = set()

    def delete_group(self, name: str) -> None:
        if name not in self._specs:
            raise GroupNotFound(name)
        del self._specs[name], self._alloc[name], self._tasks[name]

    def assign(self, group, *, pids=(), cpus=()) -> None:
        if group not in self._specs:
            raise GroupNotFound(group)
        pids, cpus = list(pids), list(cpus)
        for pid in pids:
            if int(pid) <= 0:
                raise InvalidPid(pid, f"pid {pid} is not a positive integer")
            if not os.path.exists(f"/proc/{int(pid)}"):
                raise UnknownTask(pid)
        for cpu in cpus:
            if not 0 <= cpu < self.caps.num_cpus:
                raise InvalidCpus(f"no CPU {cpu}")
        for members in self._tasks.values():
            members.difference_update(pids)
        self._tasks[group].update(pids)

    def tasks(self, group: str) -> frozenset[int]:
        if group not in self._specs:
            raise GroupNotFound(group)
        return frozenset(self._tasks[group])

    def allocation(self) -> Allocation:
        return Allocation(self._alloc)

    def reserved_ways(self) -> Mapping[int, int]:
        return dict(self.reserved)

    def apply(self, plan: AllocationPlan, *, dry_run: bool = False) -> Allocation:
        foreign = frozenset({"foreign:tool"} if self.reserved else ())
        others = {"foreign:tool": self.reserved} if self.reserved else {}
        ctx = PlanContext(self.caps, self.allocation(), exclusive=foreign, others=others)
        good = validate_plan(plan, ctx)
        merged = {g: dict(d) for g, d in self._alloc.items()}
        for group, per_domain in good.groups.items():
            for domain, a in per_domain.items():
                old = merged[group][domain]
                merged[group][domain] = dataclasses.replace(
                    old,
                    **{k: v for k, v in (("l3_mask", a.l3_mask), ("mb", a.mb)) if v is not None},
                )
        if not dry_run:
            self._alloc = merged
        return Allocation(merged)

    def observe(self) -> Snapshot:
        interval = max(self._t - self._last, 1e-3)
        self._t = self._last = self._last + interval
        groups = {
            name: GroupSample(
                instructions=1e6 * interval,
                cycles=2e6 * interval,
                llc_occupancy_bytes=float(1 << 20),
                memory_bytes=1e8 * interval,
                latency=LatencyStats.empty() if spec.slo else None,
            )
            for name, spec in self._specs.items()
        }
        return Snapshot(timestamp=self._t, interval_s=interval, groups=groups)

    def close(self) -> None:
        pass

"""Own groups kept in memory: the group side of a Node whose groups exist only in software.

A simulated node (agent.sim's ``SimNode``) and a trace-driven one (training's
``TraceNode``) hold what a resctrl filesystem holds for a real node: each own group's spec,
what it is allocated, its CPUs, and which group every known task is in. :class:`GroupTable`
owns that state and the Node protocol's rules over it (agent/node.py; the kernel's
behaviour as in docs/RESCTRL.md):

* a new group holds every way not held exclusively and MB at maximum; CLOSIDs (and, where
  the node counts them, RMIDs) run out with the default group counted;
* deleting a group returns its tasks to the default group (``""``);
* ``assign`` has kernel move semantics (a task or CPU leaves every other group);
* plans are validated by agent/validate.py and applied all-or-nothing.

Where the nodes differ the table takes constructor parameters (an RMID limit, contiguous
start masks, exclusive groups narrowed to free ways) and an ``on_change`` callback per
mutating call: it runs once, after every check has passed and just before the table
changes, so a node that keeps state derived from the groups (SimNode's per-group counter
accumulators and cached model inputs) can settle it under the old groups first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from agent.errors import GroupExists, GroupNotFound, ResourceExhausted
from agent.types import Allocation, AllocationPlan, GroupAllocation, GroupSpec, NodeCapabilities
from agent.validate import PlanContext, check_assign_ids, validate_plan

OnChange = Callable[[], None] | None


def lowest_run(mask: int) -> int:
    """The lowest run of consecutive set bits of ``mask`` (0 for 0)."""
    if mask <= 0:
        return 0
    low = mask & -mask
    return mask & ~(mask + low)


class GroupTable:
    """Specs, allocations, CPUs and task placement of a node's own groups.

    One :class:`GroupAllocation` per group stands for every domain (these nodes model one
    allocation per group; read-backs repeat it over ``caps.domains``). The dicts are the
    node's to read (in creation order, which is also row order for per-group arrays);
    change them only through the methods, which keep the cached read-back current.

    Args:
        caps: the node's capabilities (CLOSIDs, ways, MBA, CPUs, domains).
        pids: every task the node knows; all start in the default group.
        rmids: RMIDs including the default group's, when they limit groups (None: not).
        contiguous: start a new group on the lowest run of the ways it may use, for CPUs
            that refuse non-contiguous masks.
        exclusive_free_ways: start an exclusive group on the lowest run of ways no own
            group uses, when that run is long enough (as ResctrlNode does).
    """

    def __init__(
        self,
        caps: NodeCapabilities,
        pids: Iterable[int],
        *,
        rmids: int | None = None,
        contiguous: bool = False,
        exclusive_free_ways: bool = False,
    ) -> None:
        self.caps = caps
        self.rmids = rmids
        self.contiguous = contiguous
        self.exclusive_free_ways = exclusive_free_ways
        self.specs: dict[str, GroupSpec] = {}  # each with the generation it was created as
        self._created = 0  # groups created so far: the next one's generation less one
        self.alloc: dict[str, GroupAllocation] = {}
        self.cpus: dict[str, set[int]] = {}
        self.task_group: dict[int, str] = dict.fromkeys(pids, "")
        # The read-back, built once per change: callers compare it by identity to learn
        # that nothing moved (envs' SimPartitionEnv skips re-applying a held plan).
        self._held: Allocation | None = None
        self._context: PlanContext | None = None  # for _held and the current specs
        self._valid: dict = {}  # plan entries found valid against caps (validate_plan)

    # ------------------------------------------------------------------ reading

    def groups(self) -> Mapping[str, GroupSpec]:
        """A read-only copy of the specs (later changes do not show through)."""
        return MappingProxyType(dict(self.specs))

    def tasks(self, group: str) -> frozenset[int]:
        if group not in self.specs:
            raise GroupNotFound(group)
        return frozenset(p for p, g in self.task_group.items() if g == group)

    def majority_group(self, pids: Iterable[int]) -> str:
        """The group holding most of ``pids``, ties going to the default group ``""``: a
        workload whose threads are split among groups (CoCo-style time-sharing) runs with
        that group's allocation on these nodes."""
        counts: dict[str, int] = {}
        task_group = self.task_group
        for p in pids:
            g = task_group[p]
            counts[g] = counts.get(g, 0) + 1
        return max(counts, key=lambda g: (counts[g], g == ""))

    def allocation(self) -> Allocation:
        """What the own groups hold now; the same object until the next change."""
        if self._held is None:
            self._held = self.as_allocation(self.alloc)
        return self._held

    def as_allocation(self, alloc: Mapping[str, GroupAllocation]) -> Allocation:
        doms = self.caps.domains
        return Allocation.adopt({g: dict.fromkeys(doms, a) for g, a in alloc.items()})

    def plan_context(self) -> PlanContext:
        held = self.allocation()
        ctx = self._context
        if ctx is None or ctx.current is not held:
            excl = frozenset(n for n, g in self.specs.items() if g.exclusive)
            ctx = PlanContext(caps=self.caps, current=held, exclusive=excl, valid=self._valid)
            self._context = ctx
        return ctx

    def would_hold(self, plan: AllocationPlan) -> dict[str, GroupAllocation]:
        """Per group, what ``plan`` applied over the current allocation gives; validated
        (raises as ``apply`` would) and without changing anything."""
        normalized = validate_plan(plan, self.plan_context())
        new = dict(self.alloc)
        for group, per_domain in normalized.groups.items():
            for a in per_domain.values():
                new[group] = new[group].overlay(a)
        return new

    # ------------------------------------------------------------------ changing

    def create(self, spec: GroupSpec, on_change: OnChange = None) -> None:
        if not isinstance(spec, GroupSpec):
            raise TypeError(f"expected a GroupSpec, got {type(spec).__name__}")
        if spec.name in self.specs:
            raise GroupExists(spec.name)
        if len(self.specs) + 1 >= self.caps.num_closids:
            raise ResourceExhausted(
                f"Out of CLOSIDs: {self.caps.num_closids} including the default group",
                resource="closid",
            )
        if self.rmids is not None and len(self.specs) + 1 >= self.rmids:
            raise ResourceExhausted("Out of RMIDs", resource="rmid")
        mask = self._initial_mask(spec)
        mb = self.caps.mba.max_bandwidth if self.caps.mba is not None else None
        if on_change is not None:
            on_change()
        self._created += 1  # each creation its own generation
        self.specs[spec.name] = replace(spec, generation=self._created)
        self.alloc[spec.name] = GroupAllocation(l3_mask=mask, mb=mb)
        self.cpus[spec.name] = set()
        self._held = None

    def delete(self, name: str, on_change: OnChange = None) -> int:
        """Delete group ``name``, its tasks going to the default group; return the
        position it had (its row in the node's per-group arrays)."""
        if name not in self.specs:
            raise GroupNotFound(name)
        if on_change is not None:
            on_change()
        for pid, g in self.task_group.items():
            if g == name:
                self.task_group[pid] = ""
        row = list(self.specs).index(name)
        del self.specs[name], self.alloc[name], self.cpus[name]
        self._held = None
        return row

    def assign(
        self,
        group: str,
        pids: Iterable[int] = (),
        cpus: Iterable[int] = (),
        on_change: OnChange = None,
    ) -> bool:
        """Move tasks and CPUs into ``group``; True when tasks moved. ``on_change`` runs
        only then: CPUs carry no counters or model inputs on these nodes."""
        if group not in self.specs:
            raise GroupNotFound(group)
        pids, cpus = check_assign_ids(
            pids, cpus, known_pids=self.task_group, num_cpus=self.caps.num_cpus
        )
        if pids:
            if on_change is not None:
                on_change()
            for pid in pids:
                self.task_group[pid] = group
        for cpu in cpus:
            for s in self.cpus.values():
                s.discard(cpu)
            self.cpus[group].add(cpu)
        return bool(pids)

    def apply(
        self, plan: AllocationPlan, *, dry_run: bool = False, on_change: OnChange = None
    ) -> Allocation:
        """Validate ``plan`` and apply it whole (Node.apply). ``on_change`` runs only when
        the allocation really changes; re-applying what is held keeps the read-back."""
        new = self.would_hold(plan)
        if dry_run:
            return self.as_allocation(new)
        if new != self.alloc:
            if on_change is not None:
                on_change()
            self.alloc = new
            self._held = None
        return self.allocation()

    # ------------------------------------------------------------------ internals

    def _initial_mask(self, spec: GroupSpec) -> int | None:
        l3 = self.caps.l3
        if l3 is None:
            return None
        held = 0
        for name, g in self.specs.items():
            if g.exclusive:
                held |= self.alloc[name].l3_mask or 0
        least = max(1, l3.min_cbm_bits)
        mask = l3.cbm_mask & ~held
        if self.contiguous:
            mask = lowest_run(mask)
        if spec.exclusive and self.exclusive_free_ways:
            # Narrow to the lowest run of ways no other own group uses (the default group
            # is not counted: it cannot be shrunk here). Leniently, when every way is in
            # use, start like any new group (overlapping non-exclusive groups) and let the
            # first plan separate them.
            used = 0
            for a in self.alloc.values():
                used |= (a.l3_mask or 0) | (a.l3_code_mask or 0)
            free = lowest_run(l3.cbm_mask & ~used)
            if free.bit_count() >= least:
                mask = free
        if mask.bit_count() < least:
            raise ResourceExhausted(
                f"cannot create group {spec.name!r}: no free ways for it "
                f"(exclusive groups hold {held:#x})",
                resource="ways",
            )
        return mask

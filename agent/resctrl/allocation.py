"""Allocations of a ResctrlNode: reading every group's schemata (by value), validating a plan
against what the kernel holds (foreign groups' masks and exclusive groups included), and
applying it all-or-nothing: shrinking groups first, one schemata write per group, the
intent journalled, and what was changed restored when the kernel refuses a write
(docs/RESCTRL.md, "Schemata"). A part of :class:`~agent.resctrl.node.ResctrlNode`."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import replace

from agent.errors import (
    KernelError,
)
from agent.resctrl import discovery, schemata, state
from agent.resctrl.lock import ResctrlLock
from agent.types import (
    Allocation,
    AllocationPlan,
    GroupAllocation,
    GroupSpec,
    NodeCapabilities,
)
from agent.validate import PlanContext, validate_plan

log = logging.getLogger(__name__)


class Allocations:
    """Schemata reads and the all-or-nothing apply (a part of ResctrlNode)."""

    # The node's state (agent/resctrl/node.py sets it up).
    root: str
    prefix: str
    runtime_classes: frozenset[str]
    _lock: ResctrlLock
    _caps: NodeCapabilities
    _specs: dict[str, GroupSpec]
    _cdp: bool
    _digits: int
    _journal: state.Journal

    def _read_schemata(self, name: str) -> schemata.Schemata:
        return schemata.parse(discovery.read_text(self._path(name, "schemata")))

    def _to_alloc(self, held: schemata.Schemata) -> dict[int, GroupAllocation]:
        return {d: held.allocation(d, self._cdp) for d in self._caps.domains}

    def _read_all(self) -> dict[str, schemata.Schemata]:
        out = {}
        for name in list(self._specs):
            try:
                out[name] = self._read_schemata(name)
            except FileNotFoundError:
                self._check_vanished()
        return out

    def allocation(self) -> Allocation:
        with self._lock.shared():
            held = self._read_all()
        return Allocation({n: self._to_alloc(s) for n, s in held.items()})

    def _foreign_dirs(self) -> list[str]:
        """Control groups that are not own: other tools' (whatever their names)."""
        own = {self._dirname(n) for n in self._specs}
        if self._creating is not None:
            own.add(self._dirname(self._creating))
        return [
            e
            for e in os.listdir(self.root)
            if e != "info"
            and e not in own
            and os.path.isfile(os.path.join(self.root, e, "schemata"))
        ]

    def _others_masks(self) -> dict[str, dict[int, int]]:
        """L3 masks (code | data) of the default group ("") and foreign groups."""
        out: dict[str, dict[int, int]] = {}
        for entry in ["", *self._foreign_dirs()]:
            held = schemata.parse(discovery.read_text(os.path.join(self.root, entry, "schemata")))
            out["" if not entry else f"foreign:{entry}"] = l3_ways(held)
        return out

    def _exclusive_groups(self) -> frozenset[str]:
        # Own groups' modes are ours to set (create_group): no need to read them back.
        names = {name for name, spec in self._specs.items() if spec.exclusive}
        for entry in self._foreign_dirs():
            mode = os.path.join(self.root, entry, "mode")
            if os.path.exists(mode) and discovery.read_text(mode).strip() == "exclusive":
                names.add(f"foreign:{entry}")
        return frozenset(names)

    def _expand_cdp(self, plan: AllocationPlan) -> AllocationPlan:
        """With CDP a plain l3_mask means code and data alike (GroupAllocation's meaning)."""
        if not self._cdp or not isinstance(plan, AllocationPlan):
            return plan
        return AllocationPlan(
            {
                g: {
                    d: replace(a, l3_code_mask=a.l3_mask)
                    if isinstance(a, GroupAllocation) and a.l3_code_mask is None
                    else a
                    for d, a in per_dom.items()
                }
                for g, per_dom in plan.groups.items()
            }
        )

    def apply(self, plan: AllocationPlan, *, dry_run: bool = False) -> Allocation:
        with self._lock.exclusive():
            # Markers only of the groups written (below): a stat each, not one per group.
            self._check_vanished(markers=False)
            held = self._read_all()
            current = Allocation({n: self._to_alloc(s) for n, s in held.items()})
            ctx = PlanContext(
                caps=self._caps,
                current=current,
                exclusive=self._exclusive_groups(),
                others=self._others_masks(),
            )
            plan = validate_plan(self._expand_cdp(plan), ctx)
            if dry_run:
                merged = {n: dict(per) for n, per in current.groups.items()}
                for g, per_dom in plan.groups.items():
                    for d, a in per_dom.items():
                        merged[g][d] = merged[g].get(d, GroupAllocation()).overlay(a)
                return Allocation(merged)
            writes = []
            for group, per_dom in plan.groups.items():
                changes = schemata.changes_for(per_dom, held[group], self._cdp)
                if changes:
                    writes.append((self._growth(changes, held[group]), group, changes))
            writes.sort(key=lambda w: w[0])  # shrinking groups first: no transient overlap
            self._require_unchanged([g for _, g, _ in writes])
            if len(writes) > 1:
                # One schemata write is atomic in the kernel; several are not: journal the
                # old values so a crash between them is rolled back at the next start.
                self._intend(
                    {
                        "op": "apply",
                        "order": [g for _, g, _ in writes],
                        "groups": {
                            g: {"old": _old_values(changes, held[g])} for _, g, changes in writes
                        },
                    },
                    "apply the plan",
                )
            done: list[tuple[str, dict[str, dict[int, int]]]] = []
            for _, group, changes in writes:
                path = self._path(group, "schemata")
                try:
                    self._write(path, schemata.format_write(changes, self._digits))
                except OSError as exc:
                    status = self._status()
                    failed = self._restore(done, held)
                    if not failed and len(writes) > 1:
                        self._journal.clear()  # restored: no crash left anything to repair
                    msg = f"the kernel refused the schemata of group {group!r}"
                    if done:
                        msg += f"; restored {', '.join(repr(g) for g, _ in done)}"
                    if failed:
                        msg += f"; COULD NOT restore {', '.join(failed)}"
                    raise KernelError(msg, err=exc.errno or 0, status=status, path=path) from None
                done.append((group, changes))
            if len(writes) > 1:
                self._journal.clear()
            result = self._read_all()
        return Allocation({n: self._to_alloc(s) for n, s in result.items()})

    @staticmethod
    def _growth(changes: Mapping[str, Mapping[int, int]], held: schemata.Schemata) -> int:
        """Ways a write adds that the group did not hold (0 = only shrinks or MB changes)."""
        grown = 0
        for res, per_dom in changes.items():
            if res == "MB":
                continue
            for d, v in per_dom.items():
                grown += (v & ~(held.get(res, d) or 0)).bit_count()
        return grown

    def _restore(
        self,
        done: list[tuple[str, dict[str, dict[int, int]]]],
        held: Mapping[str, schemata.Schemata],
    ) -> list[str]:
        failed = []
        for group, changes in reversed(done):
            old = {
                res: {d: held[group].resources[res][d] for d in per_dom}
                for res, per_dom in changes.items()
            }
            try:
                self._write(self._path(group, "schemata"), schemata.format_write(old, self._digits))
            except OSError as exc:
                log.error("could not restore the schemata of group %r: %s", group, exc)
                failed.append(repr(group))
        return failed


def _old_values(
    changes: Mapping[str, Mapping[int, int]], held: schemata.Schemata
) -> dict[str, dict[str, int]]:
    """What a group held of every value an apply changes (JSON-ready)."""
    return {
        res: {str(d): held.resources[res][d] for d in per_dom} for res, per_dom in changes.items()
    }


def l3_ways(held: schemata.Schemata) -> dict[int, int]:
    """Per L3 domain, the ways a group's schemata uses (code and data OR-ed)."""
    per_dom: dict[int, int] = {}
    for res in schemata.L3_NAMES:
        for d, v in held.resources.get(res, {}).items():
            per_dom[d] = per_dom.get(d, 0) | v
    return per_dom

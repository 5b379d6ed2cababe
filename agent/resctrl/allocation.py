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
    _unrestored: dict[str, dict[str, dict[str, int]]]

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
        """L3 masks (code | data) of the default group ("") and foreign groups (one that
        another tool removes while they are read holds nothing)."""
        out: dict[str, dict[int, int]] = {}
        for entry in ["", *self._foreign_dirs()]:
            text = _foreign_text(os.path.join(self.root, entry, "schemata"), entry)
            if text is not None:
                out["" if not entry else f"foreign:{entry}"] = l3_ways(schemata.parse(text))
        return out

    def _exclusive_groups(self) -> frozenset[str]:
        # Own groups' modes are ours to set (create_group): no need to read them back.
        names = {name for name, spec in self._specs.items() if spec.exclusive}
        for entry in self._foreign_dirs():
            mode = _foreign_text(os.path.join(self.root, entry, "mode"), entry)
            if mode is not None and mode.strip() == "exclusive":
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
            old = {g: _old_values(changes, held[g]) for _, g, changes in writes}
            # what an earlier refused apply could not put back, and this one does not write
            left = _not_written(self._unrestored, dict((g, c) for _, g, c in writes))
            journaled = len(writes) > 1 or bool(self._unrestored and writes)
            if journaled:
                # One schemata write is atomic in the kernel; several are not: journal the
                # old values so a crash between them is rolled back at the next start.
                order = [g for _, g, _ in writes]
                self._intend(_apply_record([*order, *left], {**old, **left}), "apply the plan")
            done: list[tuple[str, dict[str, dict[int, int]]]] = []
            for _, group, changes in writes:
                path = self._path(group, "schemata")
                try:
                    self._write(path, schemata.format_write(changes, self._digits))
                except OSError as exc:
                    status = self._status()
                    failed = self._restore(done, held)
                    # a group not put back keeps the values of the last whole plan it held
                    self._settle(
                        {g: _merged(old[g], self._unrestored.get(g)) for g in failed}, journaled
                    )
                    msg = f"the kernel refused the schemata of group {group!r}"
                    if restored := [repr(g) for g, _ in done if g not in failed]:
                        msg += f"; restored {', '.join(restored)}"
                    if failed:
                        msg += f"; COULD NOT restore {', '.join(map(repr, failed))}"
                    raise KernelError(msg, err=exc.errno or 0, status=status, path=path) from None
                done.append((group, changes))
            if writes:
                self._unrestored = {}
                self._settle(left, journaled)
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

    def _settle(self, unrestored: Mapping[str, dict], journaled: bool) -> None:
        """After an apply: add ``unrestored`` (group -> the values to roll back to) to what
        earlier refused applies could not put back, and leave the journal holding exactly
        that, so a restart rolls back those values and nothing else. Nothing is written when
        nothing was journalled and nothing is left (the hot path's one-group apply)."""
        self._unrestored = {
            g: v for g, v in {**self._unrestored, **unrestored}.items() if g in self._specs
        }
        if self._unrestored:
            record = _apply_record(list(self._unrestored), self._unrestored)
            try:
                self._journal.write(record)
            except OSError as exc:
                log.error("could not journal the values left to restore %r: %s", record, exc)
        elif journaled:
            self._journal.clear()

    def _restore(
        self,
        done: list[tuple[str, dict[str, dict[int, int]]]],
        held: Mapping[str, schemata.Schemata],
    ) -> list[str]:
        """Put back what ``done`` wrote, last first; the groups that could not be."""
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
                failed.append(group)
        return failed


def _old_values(
    changes: Mapping[str, Mapping[int, int]], held: schemata.Schemata
) -> dict[str, dict[str, int]]:
    """What a group held of every value an apply changes (JSON-ready)."""
    return {
        res: {str(d): held.resources[res][d] for d in per_dom} for res, per_dom in changes.items()
    }


def _foreign_text(path: str, entry: str) -> str | None:
    """A file of the default group (``entry`` "") or of a foreign group, or None when the
    group is gone (removed by its tool since the root was listed). The default group's
    files are always there: their absence stays an error."""
    try:
        return discovery.read_text(path)
    except FileNotFoundError:
        if not entry:
            raise
        return None


def _apply_record(order: list[str], old: Mapping[str, dict]) -> dict:
    """The intent record of an apply: the groups in the order written, and their old
    values (a restart rolls them back, last first)."""
    return {"op": "apply", "order": order, "groups": {g: {"old": old[g]} for g in order}}


def _merged(old: dict[str, dict[str, int]], older: dict | None) -> dict[str, dict[str, int]]:
    """A group's values to roll back to: ``old``, except where ``older`` (what an earlier
    refused apply could not put back) has the value of a plan before."""
    out = {res: dict(per_dom) for res, per_dom in old.items()}
    for res, per_dom in (older or {}).items():
        out.setdefault(res, {}).update(per_dom)
    return out


def _not_written(
    unrestored: Mapping[str, dict[str, dict[str, int]]],
    changes: Mapping[str, Mapping[str, Mapping[int, int]]],
) -> dict[str, dict[str, dict[str, int]]]:
    """The values of ``unrestored`` that ``changes`` (group -> resource -> domain -> value)
    does not write: an apply that writes a value makes it intended again."""
    out = {}
    for g, per_res in unrestored.items():
        kept = {
            res: {d: v for d, v in per_dom.items() if int(d) not in changes.get(g, {}).get(res, {})}
            for res, per_dom in per_res.items()
        }
        kept = {res: per_dom for res, per_dom in kept.items() if per_dom}
        if kept:
            out[g] = kept
    return out


def l3_ways(held: schemata.Schemata) -> dict[int, int]:
    """Per L3 domain, the ways a group's schemata uses (code and data OR-ed)."""
    per_dom: dict[int, int] = {}
    for res in schemata.L3_NAMES:
        for d, v in held.resources.get(res, {}).items():
            per_dom[d] = per_dom.get(d, 0) | v
    return per_dom

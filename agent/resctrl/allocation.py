"""Allocations of a ResctrlNode: reading every group's schemata (by value), validating a plan
against what the kernel holds (foreign groups' masks and exclusive groups included), and
applying it all-or-nothing: shrinking groups first, one schemata write per group (two
where an exclusive group needs the shrinks done before the growths), the intent
journalled, and what was changed restored when the kernel refuses a write
(docs/RESCTRL.md, "Schemata"). A part of :class:`~agent.resctrl.node.ResctrlNode`."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Mapping
from dataclasses import replace

from agent.errors import InvalidAllocation, KernelError
from agent.resctrl import discovery, schemata, state
from agent.resctrl.lock import ResctrlLock
from agent.types import (
    Allocation,
    AllocationPlan,
    GroupAllocation,
    GroupSpec,
    MbaMode,
    NodeCapabilities,
)
from agent.validate import PlanContext, overlap_refused, validate_plan

log = logging.getLogger(__name__)

U32_MAX = 2**32 - 1  # the largest MB value the kernel parses (kstrtou32)


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

    _mb_max: int | None = None  # AMD: the MB maximum, once learnt

    def _know_mb_max(self, value: int | None) -> None:
        """On AMD, take ``value`` (learnt from a group this node made, now or in an earlier
        run) as the MB maximum; None: not learnt yet."""
        mba = self._caps.mba
        if mba is None or mba.mode is not MbaMode.AMD or value is None:
            return
        # What a group holds never exceeds the maximum: a larger value held means the one
        # recorded is stale (another machine's state directory).
        value = max(value, mba.max_bandwidth)
        self._mb_max = value
        self._caps = replace(self._caps, mba=replace(mba, max_bandwidth=value))

    def _learn_mb_max(self, path: str) -> None:
        """Read the MB values of the control group just made at ``path``: on AMD the
        hardware maximum, where the kernel starts a new group (rdtgroup_init_mba) and which
        info/MB does not name."""
        mba = self._caps.mba
        if mba is None or mba.mode is not MbaMode.AMD:
            return
        try:
            held = schemata.parse(discovery.read_text(os.path.join(path, "schemata")))
        except (OSError, schemata.SchemataError) as exc:
            log.warning("could not read the MB maximum from %s: %s", path, exc)
            return
        if values := held.resources.get("MB"):
            self._know_mb_max(max(values.values()))

    def _plan_caps(self) -> NodeCapabilities:
        """The capabilities a plan is checked against: on AMD, until a group this node made
        has shown the MB maximum, none above what groups hold is refused (discovery's
        figure is only the largest value held: the kernel judges the rest)."""
        mba = self._caps.mba
        if mba is None or mba.mode is not MbaMode.AMD or self._mb_max is not None:
            return self._caps
        return replace(self._caps, mba=replace(mba, max_bandwidth=U32_MAX))

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
        """The groups whose ways no other group's mask may overlap: exclusive ones (the
        default group too: rdtgroup_mode_write makes no exception for it) and pseudo-locked
        regions (parse_cbm refuses an overlap with one)."""
        # Own groups' modes are ours to set (create_group): no need to read them back.
        names = {name for name, spec in self._specs.items() if spec.exclusive}
        for entry in ["", *self._foreign_dirs()]:
            if _mode(self.root, entry) in ("exclusive", "pseudo-locked"):
                names.add(f"foreign:{entry}" if entry else "")
        return frozenset(names)

    def reserved_ways(self) -> dict[int, int]:
        """Per L3 domain, the ways of the groups the node does not own that no own group's
        mask may overlap (:meth:`_exclusive_groups` less the own ones): what the
        validator refuses an overlap with, read the same way."""
        with self._lock.shared():
            return reserved_of(self._others_masks(), self._exclusive_groups())

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
                caps=self._plan_caps(),
                current=current,
                exclusive=self._exclusive_groups(),
                others=self._others_masks(),
            )
            plan = validate_plan(self._expand_cdp(plan), ctx)
            changes_of = {}
            for group, per_dom in plan.groups.items():
                if changes := schemata.changes_for(per_dom, held[group], self._cdp):
                    changes_of[group] = changes
            steps = _write_steps(changes_of, held, ctx)  # what a dry run checks too
            if dry_run:
                merged = {n: dict(per) for n, per in current.groups.items()}
                for g, per_dom in plan.groups.items():
                    for d, a in per_dom.items():
                        merged[g][d] = merged[g].get(d, GroupAllocation()).overlay(a)
                return Allocation(merged)
            written = list(dict.fromkeys(g for g, _, _ in steps))
            self._require_unchanged(written)
            old = {g: _old_values(changes_of[g], held[g]) for g in written}
            # what an earlier refused apply could not put back, and this one does not write
            left = _not_written(self._unrestored, changes_of)
            journaled = len(steps) > 1 or bool(self._unrestored and steps)
            if journaled:
                # One schemata write is atomic in the kernel; several are not: journal the
                # old values so a crash between them is rolled back at the next start.
                record = _apply_record([*written, *left], {**old, **left})
                if len(steps) > len(written):  # a group written twice: undo step by step
                    record["steps"] = [
                        *([g, v] for g, v in left.items()),  # undone last
                        *([g, _json_values(before)] for g, _, before in steps),
                    ]
                self._intend(record, "apply the plan")
            done: list[tuple[str, dict[str, dict[int, int]]]] = []
            for group, changes, before in steps:
                path = self._path(group, "schemata")
                try:
                    self._write(path, schemata.format_write(changes, self._digits))
                except OSError as exc:
                    raise self._refused(group, path, exc, done, old, journaled) from None
                done.append((group, before))
            if steps:
                self._unrestored = {}
                self._settle(left, journaled)
            result = self._read_all()
        return Allocation({n: self._to_alloc(s) for n, s in result.items()})

    def _refused(
        self,
        group: str,
        path: str,
        exc: OSError,
        done: list[tuple[str, Values]],
        old: Mapping[str, dict],
        journaled: bool,
    ) -> KernelError:
        """The kernel refused ``group``'s write: undo ``done``, journal what could not be
        undone, and say so."""
        status = self._status()
        failed = self._restore(done)
        # a group not put back keeps the values of the last whole plan it held
        self._settle({g: _merged(old[g], self._unrestored.get(g)) for g in failed}, journaled)
        msg = f"the kernel refused the schemata of group {group!r}"
        if restored := [repr(g) for g in dict.fromkeys(g for g, _ in done) if g not in failed]:
            msg += f"; restored {', '.join(restored)}"
        if failed:
            msg += f"; COULD NOT restore {', '.join(map(repr, failed))}"
        return KernelError(msg, err=exc.errno or 0, status=status, path=path)

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

    def _restore(self, done: list[tuple[str, dict[str, dict[int, int]]]]) -> list[str]:
        """Undo the writes of ``done`` (group, the values before the write), last first, so
        the node goes back through the states it came by; the groups that could not be."""
        failed: list[str] = []
        for group, before in reversed(done):
            try:
                text = schemata.format_write(before, self._digits)
                self._write(self._path(group, "schemata"), text)
            except OSError as exc:
                log.error("could not restore the schemata of group %r: %s", group, exc)
                if group not in failed:
                    failed.append(group)
        return failed


def _old_values(
    changes: Mapping[str, Mapping[int, int]], held: schemata.Schemata
) -> dict[str, dict[str, int]]:
    """What a group held of every value an apply changes (JSON-ready)."""
    return {
        res: {str(d): held.resources[res][d] for d in per_dom} for res, per_dom in changes.items()
    }


Values = dict[str, dict[int, int]]  # resource -> domain -> mask or MB value


def _write_steps(
    changes_of: Mapping[str, Values],
    held: Mapping[str, schemata.Schemata],
    ctx: PlanContext,
) -> list[tuple[str, Values, Values]]:
    """The schemata writes that take each group from ``held`` to ``changes_of`` (group ->
    its changed values), as (group, values written, the values before).

    Where no group is exclusive (the kernel then checks no overlap): one write per group,
    the groups that grow least first. With an exclusive group on the node every write must
    keep it apart from every other group, which one write per group cannot always do (a
    group growing in one domain and shrinking in another): each group first shrinks, in
    one write, to what it keeps of each changing mask (old & new, when the kernel takes
    that as a mask) and sets its MB values; then the groups take their new masks, each
    time one whose write overlaps nothing the kernel forbids. Where none is left that can
    (ways traded with an exclusive group), InvalidAllocation, before anything is written."""
    now = {
        g: {res: {d: held[g].get(res, d) for d in per} for res, per in ch.items()}
        for g, ch in changes_of.items()
    }
    steps: list[tuple[str, Values, Values]] = []
    # every group's ways, for the overlaps the kernel checks only with an exclusive group
    ways = {**{g: l3_ways(s) for g, s in held.items()}, **ctx.others} if ctx.exclusive else {}

    def step(group: str, values: Values) -> None:
        before = {res: {d: now[group][res][d] for d in per} for res, per in values.items()}
        for res, per in values.items():
            now[group][res].update(per)
        if ctx.exclusive:
            ways[group] = _ways_now(held[group], now[group])
        steps.append((group, values, before))

    min_bits = max(1, ctx.caps.l3.min_cbm_bits) if ctx.caps.l3 else 1
    if ctx.exclusive:
        for g, ch in changes_of.items():
            if first := _kept(ch, now[g], min_bits):
                step(g, first)
    pending = []
    for g, ch in changes_of.items():
        last = {
            res: {d: v for d, v in per.items() if now[g][res][d] != v} for res, per in ch.items()
        }
        if last := {res: per for res, per in last.items() if per}:
            pending.append((_growth(last, now[g]), g, last))
    pending.sort(key=lambda p: p[0])  # shrinking groups first
    while pending:
        k = next((i for i, (_, g, v) in enumerate(pending) if not _clashes(g, v, ways, ctx)), None)
        if k is None:
            names = ", ".join(repr(g) for _, g, _ in pending)
            raise InvalidAllocation(
                f"no order of schemata writes takes groups {names} to the plan without an "
                "overlap the kernel refuses (ways traded with an exclusive group): apply it "
                "as two plans, the ways given up first",
                rule="exclusive_overlap",
                group=pending[0][1],
            )
        _, g, last = pending.pop(k)
        step(g, last)
    return steps


def _kept(changes: Values, now: Values, min_bits: int) -> Values:
    """What a group keeps of each changing mask (old & new) where that is a mask the kernel
    takes and less than it holds, and its new MB values: a write that overlaps nothing
    new."""
    out: Values = {}
    for res, per in changes.items():
        for d, new in per.items():
            was = now[res][d] or 0
            keep = new if res == "MB" else was & new
            if keep != was and (res == "MB" or keep.bit_count() >= min_bits):
                out.setdefault(res, {})[d] = keep
    return out


def _clashes(
    group: str, values: Values, ways: Mapping[str, Mapping[int, int]], ctx: PlanContext
) -> bool:
    """Whether the kernel would refuse ``values`` for ``group`` as an overlap, the groups
    holding ``ways`` (the validator's rule, :func:`agent.validate.overlap_refused`)."""
    if not ctx.exclusive:
        return False
    hardware = ctx.caps.l3.shareable_bits if ctx.caps.l3 else 0
    return any(
        overlap_refused(group, v, d, ways, ctx.exclusive, hardware) is not None
        for res, per in values.items()
        if res != "MB"
        for d, v in per.items()
    )


def _ways_now(held: schemata.Schemata, now: Values) -> dict[int, int]:
    """Per L3 domain, the ways a group uses (code and data OR-ed) once ``now``'s values
    replace what it ``held``."""
    out: dict[int, int] = {}
    for res in schemata.L3_NAMES:
        for d, v in {**held.resources.get(res, {}), **now.get(res, {})}.items():
            out[d] = out.get(d, 0) | (v or 0)
    return out


def _growth(values: Values, now: Values) -> int:
    """Ways a write adds that the group does not hold (0 = only shrinks or MB changes)."""
    grown = 0
    for res, per in values.items():
        if res != "MB":
            grown += sum((v & ~(now[res][d] or 0)).bit_count() for d, v in per.items())
    return grown


def _json_values(values: Values) -> dict[str, dict[str, int]]:
    return {res: {str(d): v for d, v in per.items()} for res, per in values.items()}


def _foreign_text(path: str, entry: str) -> str | None:
    """A file of the default group (``entry`` "") or of a foreign group, or None when the
    group is gone (removed by its tool since the root was listed) or its file cannot be
    read (ENODEV: a pseudo-locked region whose cache domain went offline, which holds no
    ways then). The default group's files are always there: their absence stays an
    error."""
    try:
        return discovery.read_text(path)
    except OSError as exc:
        if not entry or exc.errno not in (errno.ENOENT, errno.ENODEV):
            raise
        return None


def _mode(root: str, entry: str) -> str:
    """The mode of the default group (``entry`` "") or of a foreign group; "shareable"
    where there is none to read (kernels before 4.19 have no mode file; a foreign group
    may be removed while it is read)."""
    try:
        text = _foreign_text(os.path.join(root, entry, "mode"), entry)
    except FileNotFoundError:
        text = None
    return text.strip() if text is not None else "shareable"


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


def reserved_of(
    others: Mapping[str, Mapping[int, int]], exclusive: frozenset[str]
) -> dict[int, int]:
    """Per domain, the ways of the ``others`` (groups the node does not own, by name) that
    are ``exclusive``; domains where none holds any are left out."""
    out: dict[int, int] = {}
    for name, per_dom in others.items():
        if name in exclusive:
            for d, ways in per_dom.items():
                if ways:
                    out[d] = out.get(d, 0) | ways
    return out


def l3_ways(held: schemata.Schemata) -> dict[int, int]:
    """Per L3 domain, the ways a group's schemata uses (code and data OR-ed)."""
    per_dom: dict[int, int] = {}
    for res in schemata.L3_NAMES:
        for d, v in held.resources.get(res, {}).items():
            per_dom[d] = per_dom.get(d, 0) | v
    return per_dom

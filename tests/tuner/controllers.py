"""Misbehaving controllers for the tuner's tests (``import:tests.tuner.controllers:NAME``).

They are real Controller subclasses run by the real tuner; what they get wrong is the point.
"""

from __future__ import annotations

from agent.types import AllocationPlan, GroupAllocation, Snapshot
from models.allocation import equal_masks, mb_level, plan_from
from models.controller import KEEP, ControlContext, Controller, Decision


class Broken(Controller):
    """Every other interval a plan with a non-contiguous mask (the kernel refuses those);
    in between a valid equal partition."""

    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        self.calls += 1
        caps = ctx.capabilities
        groups = sorted(ctx.groups)
        if self.calls % 2:
            bad = caps.l3.cbm_mask & ~0b10  # a hole at way 1
            return Decision(AllocationPlan.uniform({groups[0]: GroupAllocation(l3_mask=bad)}))
        masks = equal_masks(groups, caps)
        return Decision(plan_from(masks, {}, caps))


class Swing(Controller):
    """Swings every interval between two far-apart allocations: group order reversed and
    the MB values of the first and last group swapped between the minimum and maximum."""

    name = "swing"

    def __init__(self) -> None:
        self.calls = 0

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        self.calls += 1
        caps = ctx.capabilities
        groups = sorted(ctx.groups)
        if self.calls % 2:
            groups.reverse()
        masks = equal_masks(groups, caps)
        low, high = mb_level(caps, 0.0), mb_level(caps, 1.0)
        mbs = {g: (low if i == 0 else high) for i, g in enumerate(groups)}
        return Decision(plan_from(masks, mbs, caps))


class Quiet(Controller):
    """Keeps whatever the node holds (never decides anything)."""

    name = "quiet"

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        return KEEP


class Crashy(Controller):
    """Raises on every third decision (a controller bug)."""

    name = "crashy"

    def __init__(self) -> None:
        self.calls = 0

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        self.calls += 1
        if self.calls % 3 == 0:
            raise ZeroDivisionError("a bug in the controller")
        return KEEP


class BuggyStart(Controller):
    """Raises when it starts (a controller bug the tuner cannot know how to handle)."""

    name = "buggy_start"

    def start(self, ctx: ControlContext) -> Decision:
        raise ZeroDivisionError("a bug in the controller's start")

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        return KEEP


class Mover(Controller):
    """At start, moves the last group's tasks and a pid no task has (one that exited) into
    the first group; keeps afterwards."""

    name = "mover"
    needs_tasks = True
    exited = 999_999

    def start(self, ctx: ControlContext) -> Decision:
        groups = sorted(ctx.groups)
        return Decision(moves={groups[0]: ctx.tasks[groups[-1]] | {self.exited}})

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        return KEEP


class BadMove(Controller):
    """At start, moves a "pid" that is no integer into the first group (a controller bug the
    move refuses outright); keeps afterwards."""

    name = "bad_move"

    def start(self, ctx: ControlContext) -> Decision:
        return Decision(moves={sorted(ctx.groups)[0]: frozenset({1.5})})

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        return KEEP

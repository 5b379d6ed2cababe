"""The two reference points every evaluation starts from (docs/CONTROLLERS.md, "The controllers").

- :class:`Unpartitioned`: every group may use every way at full bandwidth — what a server
  does today without RDT.
- :class:`EqualPartition` (CoPart's EQ, EuroSys'19 section 6.1): ways and memory bandwidth
  split equally among the groups.

Both decide once at start and again only when the set of groups changes.
"""

from __future__ import annotations

from agent.types import AllocationPlan, Snapshot
from models.allocation import equal_masks, mb_level, plan_from, shared_plan
from models.controller import KEEP, ControlContext, Controller, Decision


class _StaticByGroups(Controller):
    """Re-plans only when the groups change."""

    def __init__(self) -> None:
        self._groups: tuple[str, ...] = ()

    def start(self, ctx: ControlContext) -> Decision:
        self._groups = tuple(ctx.groups)
        if not self._groups:
            return KEEP
        return Decision(self.plan(ctx), note=f"{self.name}: {len(self._groups)} groups")

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        if tuple(ctx.groups) != self._groups:
            return self.start(ctx)
        return KEEP

    def plan(self, ctx: ControlContext) -> AllocationPlan:
        raise NotImplementedError


class Unpartitioned(_StaticByGroups):
    name = "unpartitioned"

    def plan(self, ctx: ControlContext) -> AllocationPlan:
        return shared_plan(self._groups, ctx.usable)


class EqualPartition(_StaticByGroups):
    name = "eq"

    def plan(self, ctx: ControlContext) -> AllocationPlan:
        caps = ctx.usable  # the ways another tool holds exclusively left out
        masks = equal_masks(self._groups, caps) if caps.l3 else {}
        mb = mb_level(caps, 1.0 / len(self._groups))
        return plan_from(masks, {g: mb for g in self._groups}, caps)

"""The ``Controller`` interface every decision maker implements, and the loop that drives it.

A controller sees what a real one could see — capabilities, group specs, the allocation the
node holds, and one :class:`~agent.types.Snapshot` per interval — and answers with a
:class:`Decision`: an allocation plan (or nothing, to keep the current one) and, for
time-sharing controllers such as CoCo, tasks to move between groups. The learned policy
and every heuristic (docs/CONTROLLERS.md) implement it, so the tuner, the environments and
evaluation can swap them freely.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agent.errors import UnknownTask
from agent.node import Clock, Node
from agent.types import (
    Allocation,
    AllocationPlan,
    FrozenMap,
    GroupSpec,
    NodeCapabilities,
    Snapshot,
)
from models.allocation import usable_capabilities


@dataclass(frozen=True)
class ControlContext:
    """What a controller may know about the node besides the latest snapshot.

    Attributes:
        capabilities: the node's capabilities.
        groups: the node's own groups and their specs (kind, SLO).
        allocation: what the node holds now.
        tasks: the pids in each group (only filled for controllers that ask for it, since
            listing tasks costs a read per group on a real node).
        time_s: the node's clock (simulated or wall, seconds since start).
        reserved_ways: per L3 domain, the ways another tool holds exclusively
            (:meth:`agent.node.Node.reserved_ways`): the node refuses any mask that
            overlaps them, and the tuner trims them from every plan. :attr:`usable` is
            the capabilities within the ways left, for controllers that build masks.
    """

    capabilities: NodeCapabilities
    groups: Mapping[str, GroupSpec]
    allocation: Allocation
    tasks: Mapping[str, frozenset[int]] | None = None
    time_s: float = 0.0
    reserved_ways: Mapping[int, int] = field(default_factory=dict)

    @property
    def usable(self) -> NodeCapabilities:
        """:attr:`capabilities` with the L3 ways narrowed to those no other tool holds
        exclusively in any domain (:func:`models.allocation.usable_capabilities`)."""
        return usable_capabilities(self.capabilities, self.reserved_ways)


@dataclass(frozen=True)
class Decision:
    """A controller's answer for one interval.

    Attributes:
        plan: the allocation to apply, or None to keep what the node holds.
        moves: pids to move into each group (kernel move semantics) before ``plan``.
        note: a short human-readable reason (logged and shown in timelines).
    """

    plan: AllocationPlan | None = None
    moves: Mapping[str, frozenset[int]] = field(default_factory=dict)
    note: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "moves", FrozenMap(self.moves))

    @property
    def changes(self) -> bool:
        return self.plan is not None or bool(self.moves)


KEEP = Decision()


class Controller(ABC):
    """Base class of every controller.

    Subclasses set :attr:`name`, implement :meth:`decide`, and may override :meth:`start`
    (called once before the first interval and again whenever the set of groups changes)
    and :attr:`needs_tasks` (True to receive ``ControlContext.tasks``).
    """

    name: str = "controller"
    needs_tasks: bool = False

    def start(self, ctx: ControlContext) -> Decision:
        """Set up for the node and groups in ``ctx``; return the initial decision."""
        return KEEP

    @abstractmethod
    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        """Decide for the next interval from the last one's snapshot."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def require(ok: bool, option: str, value: object, want: str) -> None:
    """Refuse a controller option whose value is out of its range, naming it: refused as
    the controller is built, before it runs, rather than misbehaving (a negative gain
    turns a feedback loop around) or failing once a decision needs it."""
    if not ok:
        raise ValueError(f"{option} must be {want}, got {value!r}")


def context(node: Node, *, tasks: bool = False, time_s: float = 0.0) -> ControlContext:
    """Read a :class:`ControlContext` from a node."""
    groups = node.groups()
    return ControlContext(
        capabilities=node.capabilities(),
        groups=groups,
        allocation=node.allocation(),
        tasks={g: node.tasks(g) for g in groups} if tasks else None,
        time_s=time_s,
        reserved_ways=node.reserved_ways(),
    )


def move_tasks(node: Node, group: str, pids: Iterable[int]) -> frozenset[int]:
    """Move ``pids`` into ``group`` and return those the node refused as unknown.

    One call when every task still exists; when the node refuses the move because one has
    exited (tasks exit all the time on a real host, and a node refuses a move naming one
    as a whole), the rest are moved one at a time so that one exited task does not keep
    the live ones out. Other errors (the group gone) propagate.
    """
    pids = sorted(pids)
    if not pids:
        return frozenset()
    try:
        node.assign(group, pids=pids)
        return frozenset()
    except UnknownTask:
        refused = set()
        for pid in pids:
            try:
                node.assign(group, pids=[pid])
            except UnknownTask:
                refused.add(pid)
        return frozenset(refused)


def carry_out(node: Node, decision: Decision) -> Allocation | None:
    """Apply a decision to a node: task moves first (those of exited tasks skipped, see
    :func:`move_tasks`), then the plan (all-or-nothing)."""
    for group, pids in decision.moves.items():
        move_tasks(node, group, pids)
    if decision.plan is not None:
        return node.apply(decision.plan)
    return None


@dataclass
class StepRecord:
    """One interval of a controller driving a node."""

    snapshot: Snapshot
    decision: Decision
    allocation: Allocation
    decide_s: float


def drive(
    controller: Controller, node: Node, clock: Clock | None, intervals: int, interval_s: float = 0.1
) -> list[StepRecord]:
    """Run ``controller`` on ``node`` for ``intervals`` intervals and return what happened.

    With a simulated ``clock`` time is advanced by ``interval_s`` per interval; on a real node
    (``clock`` None) the loop sleeps instead. This is the plain loop used by evaluation and
    tests; the online tuner wraps the same steps with its safety guard.
    """
    now = clock.now if clock is not None else time.monotonic
    carry_out(node, controller.start(context(node, tasks=controller.needs_tasks, time_s=now())))
    records = []
    node.observe()  # start the first interval
    for _ in range(intervals):
        if clock is not None:
            clock.advance(interval_s)
        else:
            time.sleep(interval_s)
        snap = node.observe()
        ctx = context(node, tasks=controller.needs_tasks, time_s=now())
        t0 = time.perf_counter()
        decision = controller.decide(snap, ctx)
        decide_s = time.perf_counter() - t0
        held = carry_out(node, decision) or ctx.allocation
        records.append(StepRecord(snap, decision, held, decide_s))
    return records

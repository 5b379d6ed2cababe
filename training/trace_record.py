"""Recording a trace: a controller drives any Node while every interval is written.

The loop is :func:`models.controller.drive`'s, with a :class:`training.traces.TraceWriter`
taking each interval. On a simulated node (local or behind an
agent) time is advanced through its Clock, so recording is as fast as the simulator; on a
real node the loop keeps wall-clock interval deadlines.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent.errors import NodeError
from agent.node import Clock, Node, as_clock
from agent.types import Allocation, AllocationPlan
from models.controller import ControlContext, Controller, carry_out, context
from training.traces import TraceWriter

log = logging.getLogger(__name__)


def record(
    node: Node,
    controller: Controller,
    out: str | os.PathLike,
    duration_s: float,
    *,
    interval_s: float = 0.1,
    clock: Clock | str | None = "auto",
    scenario: Mapping[str, Any] | None = None,
    seed: int | None = None,
    source: str = "local",
    extra: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    replace: bool = False,
    restore: bool = True,
) -> int:
    """Drive ``controller`` on ``node`` for ``duration_s`` seconds (node time), writing every
    interval to ``out``. Returns the number of intervals recorded.

    ``clock="auto"`` uses the node's Clock when it is simulated, else the wall clock.
    ``progress(done, total)`` is called after each interval. ``replace``: whether a file at
    ``out`` when the recording ends may be replaced (:class:`training.traces.TraceWriter`).
    ``restore``: put back the allocation the node held before the controller's first
    decision when the recording ends, however it ends (the controller's last plan is no
    one's choice: exploration's is random). An exception that ends the recording carries a
    note saying where the intervals so far are.
    """
    if not (duration_s > 0 and interval_s > 0):
        raise ValueError(f"duration and interval must be > 0, got {duration_s}, {interval_s}")
    if clock == "auto":
        clock = as_clock(node)
    intervals = max(1, round(duration_s / interval_s))
    ctx = context(node, tasks=controller.needs_tasks, time_s=clock.now() if clock else 0.0)
    writer = TraceWriter(
        out,
        node.capabilities(),
        ctx.groups,
        controller.name,
        scenario=scenario,
        seed=seed,
        source=source,
        interval_s=interval_s,
        extra={
            "clock": "simulated" if clock else "wall",
            "requested_intervals": intervals,
            **(extra or {}),
        },
        replace=replace,
    )
    try:
        _drive(node, controller, ctx, writer, clock, intervals, interval_s, progress)
    except BaseException as exc:
        # Keep what was recorded: a closed trace of the intervals so far beats a lost run,
        # marked as such (Ctrl-C, SIGTERM, an agent gone).
        writer.close(stopped=type(exc).__name__ + (f": {exc}" if str(exc) else ""))
        exc.add_note(f"the {writer.steps} intervals recorded so far are in {writer.location}")
        raise
    finally:
        if restore:
            _restore(node, ctx.allocation)
    writer.close()
    return writer.steps


def _drive(
    node: Node,
    controller: Controller,
    ctx: ControlContext,
    writer: TraceWriter,
    clock: Clock | None,
    intervals: int,
    interval_s: float,
    progress: Callable[[int, int], None] | None,
) -> None:
    """The control loop from ``ctx`` (the node at the start), each interval written as it
    ends."""
    carry_out(node, controller.start(ctx))
    held = node.allocation()
    node.observe()  # start the first interval
    deadline = time.monotonic()
    for i in range(intervals):
        if clock is not None:
            clock.advance(interval_s)
        else:
            deadline += interval_s
            pause = deadline - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        snap = node.observe()
        ctx = context(
            node,
            tasks=controller.needs_tasks,
            time_s=clock.now() if clock else snap.timestamp,
        )
        decision = controller.decide(snap, ctx)
        applied = carry_out(node, decision)
        writer.write(
            snap, held, applied, controller=controller.name, note=decision.note, groups=ctx.groups
        )
        held = applied if applied is not None else ctx.allocation
        if progress is not None:
            progress(i + 1, intervals)


def _restore(node: Node, before: Allocation) -> None:
    """Apply ``before`` to the groups the node still has; a node that cannot take it (an
    agent gone) is logged, not raised: the recording's own outcome is what the caller needs."""
    try:
        groups = set(node.groups())
        plan = AllocationPlan({g: a for g, a in before.groups.items() if g in groups})
        if plan.groups:
            node.apply(plan)
    except NodeError as exc:
        log.warning("could not put back the allocation held before recording: %s", exc)

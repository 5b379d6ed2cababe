"""Recording a trace: a controller drives any Node while every interval is written.

The loop is :func:`models.controller.drive`'s, with a :class:`training.traces.TraceWriter`
taking each interval. On a simulated node (local or behind an
agent) time is advanced through its Clock, so recording is as fast as the simulator; on a
real node the loop keeps wall-clock interval deadlines.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent.node import Clock, Node, as_clock
from models.controller import Controller, carry_out, context
from training.traces import TraceWriter


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
) -> int:
    """Drive ``controller`` on ``node`` for ``duration_s`` seconds (node time), writing every
    interval to ``out``. Returns the number of intervals recorded.

    ``clock="auto"`` uses the node's Clock when it is simulated, else the wall clock.
    ``progress(done, total)`` is called after each interval.
    """
    if not (duration_s > 0 and interval_s > 0):
        raise ValueError(f"duration and interval must be > 0, got {duration_s}, {interval_s}")
    if clock == "auto":
        clock = as_clock(node)
    intervals = max(1, round(duration_s / interval_s))
    caps = node.capabilities()
    ctx = context(node, tasks=controller.needs_tasks, time_s=clock.now() if clock else 0.0)
    writer = TraceWriter(
        out,
        caps,
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
    )
    try:
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
                snap,
                held,
                applied,
                controller=controller.name,
                note=decision.note,
                groups=ctx.groups,
            )
            held = applied if applied is not None else ctx.allocation
            if progress is not None:
                progress(i + 1, intervals)
    except BaseException as exc:
        # Keep what was recorded: a closed trace of the intervals so far beats a lost run,
        # marked as such (Ctrl-C, SIGTERM, an agent gone).
        writer.close(stopped=type(exc).__name__ + (f": {exc}" if str(exc) else ""))
        raise
    writer.close()
    return writer.steps

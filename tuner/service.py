"""The online tuner: one controller driving one node through the safety guard.

Each interval: observe -> (encode ->) decide -> guard -> apply (docs/ARCHITECTURE.md, "Data flow";
the policy controller encodes features itself with models/features.py). On a simulated node
the tuner steps the node's clock by the interval (optionally also sleeping, ``realtime``);
on a real node it sleeps to a fixed-rate schedule.

The tuner is composed of this module (start, one interval, controller switches), its groups
(tuner/groups.py), its run loop with the outage handling and shutdown (tuner/outages.py)
and its pacing (tuner/pacing.py: each interval's apply and the observation starting the
next are one ``Node.step``, one round trip).

Failure handling (docs/DEPLOY.md, "What the safety guard guarantees"):

* The agent unreachable (UNAVAILABLE, a deadline) or full for now (its "retry later"
  refusals, tuner/outages.py): the interval is abandoned, the tuner
  retries with exponential backoff (``retry``), and on reconnecting re-checks its groups
  and puts back what it last applied if the node lost it (an agent restarted on a
  simulated node starts over). Apply is atomic at the node, so an interrupted apply left
  either the old allocation or the new one, never a mix; the reconciliation re-applies the
  intended one. The controller, the guard and the metrics keep their state throughout.
* The tuner dying leaves the node with its last applied (valid) allocation: nothing is
  undone on the node's side.
* Started before its agent, the tuner waits for it with the same backoff and starts when
  it answers.
* Clean shutdown optionally restores the allocation found at start (``restore_baseline``),
  retrying an agent that is down until ``restore_deadline_s``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from agent.errors import (
    GroupNotFound,
    InvalidAllocation,
    NodeError,
)
from agent.node import Node, as_clock
from agent.throttle import LogThrottle, held_back
from agent.types import Allocation, AllocationPlan, GroupKind, GroupSpec, Snapshot
from models.cadence import decided
from models.controller import ControlContext, Controller, Decision, move_tasks
from models.setup import ControllerError
from tuner.config import TunerConfig
from tuner.groups import GroupKeeper
from tuner.guard import PlanGuard, SloGuard, Switch, SwitchLog, slo_verdicts
from tuner.metrics import TunerMetrics
from tuner.outages import Resilience
from tuner.pacing import Pacing
from tuner.switching import Switching, rehearse

log = logging.getLogger("rdtune.tuner")

# Guard switches kept for the stop summary; every one is counted (and in the metrics).
KEPT_SWITCHES = 100


@dataclass
class StepResult:
    """What one interval did (returned by :meth:`Tuner.step`, handy in tests)."""

    snapshot: Snapshot
    controller: str
    outcome: str  # applied, limited, kept, dropped, error
    decide_s: float
    loop_s: float
    switch: Switch | None = None
    rule: str | None = None


class Tuner(Resilience, Pacing, Switching):
    """Controller x Node with the safety guard.

    Args:
        connect: returns a connected node (a RemoteNode in production); called again after
            an outage only if ``reconnect_new`` (a RemoteNode reconnects by itself).
        controller: builds the primary controller for the connected node (called once,
            after the first connection: a policy is checked against the node, a controller
            that calibrates may calibrate on it).
        cfg: the configuration (interval, groups, guard, fallback, retry).
        fallback: the SLO guard's fallback controller, or candidates for it in order:
            the first that can control the node (:func:`~tuner.switching.rehearse`) serves;
            eq is the last resort mid-run (tuner/switching.py).
        metrics: where to export (a fresh registry by default).
    """

    def __init__(
        self,
        connect: Callable[[], Node],
        controller: Callable[[Node], Controller],
        cfg: TunerConfig,
        fallback: Controller | Sequence[Controller],
        metrics: TunerMetrics | None = None,
    ) -> None:
        self.cfg = cfg
        self._connect = connect
        self._build_controller = controller
        self._fallbacks = [fallback] if isinstance(fallback, Controller) else list(fallback)
        self.fallback = self._fallbacks[0]
        self.metrics = metrics or TunerMetrics()
        self.plan_guard = PlanGuard(cfg.guard)
        g = cfg.guard
        self.slo_guard = SloGuard(
            g.violation_intervals,
            g.stable_intervals,
            backoff_window=g.backoff_window_intervals,
            max_stable=g.max_stable_intervals,
        )
        self.metrics.stable_intervals.set(self.slo_guard.needed)
        self.metrics.interval.set(cfg.interval_s)
        self.node: Node | None = None
        self.primary: Controller | None = None
        self.caps = None
        self.clock = None
        self.groups: dict[str, GroupSpec] = {}
        self.baseline: Allocation | None = None
        self.intended: Allocation | None = None  # what the tuner last applied (read back)
        self.pending: AllocationPlan | None = None  # an apply whose outcome is unknown
        self.target: AllocationPlan | None = None  # a rate-limited plan still being reached
        self._stale = True  # read the allocation back at the next interval
        self.keeper = GroupKeeper(cfg.groups)
        self._since_read = 0
        self.intervals = 0
        self.switches = SwitchLog(KEPT_SWITCHES)
        self.drop_log = LogThrottle()
        self._last_now = -math.inf
        self._next_tick: float | None = None
        self._init_pacing()
        self.started = False  # start() has finished once: later outages reconcile
        self._fresh = False  # the controller in charge starts at the next interval

    @property
    def active(self) -> Controller:
        return self.fallback if self.slo_guard.in_fallback else self.primary

    def start(self) -> None:
        """Connect, create or adopt the configured groups, start the controller. Safe to
        call again after it failed part-way (the agent not up yet): the connection is kept,
        and nothing counts as started until the controller has started."""
        if self.node is None:
            self.node = self._connect()
        self.caps = self.node.capabilities()
        self.clock = as_clock(self.node)
        self._realtime = self.clock is None if self.cfg.realtime is None else self.cfg.realtime
        created = self.keeper.ensure(self.node)
        self.groups = self.keeper.read(self.node, self.groups)
        self._read_reserved()
        baseline = self.node.allocation()  # before a controller's calibration changes it
        if self.primary is None:
            try:
                self.primary = self._build_controller(self.node)
                self.intended = self.node.allocation()
                self.fallback = rehearse(self._fallbacks, self._context(self.intended))
            except Exception:  # refused or a bug: the groups made for it go again
                self.primary = None
                self.keeper.undo(self.node, created)
                raise
        else:
            self.intended = baseline
        self.baseline = baseline
        self.metrics.agent_up.set(1)
        self.metrics.track(self.groups)
        self.metrics.set_active("primary", self.primary.name, self.fallback.name)
        log.info(
            "tuning %s with %s (fallback %s): %d groups, interval %.3g s%s",
            getattr(self.node, "address", "node"),
            self.primary.name,
            self.fallback.name,
            len(self.groups),
            self.cfg.interval_s,
            ", simulated clock" if self.clock is not None else "",
            extra={"event": "start", "controller": self.primary.name, "groups": list(self.groups)},
        )
        self._stale, self._since_read = False, 0  # ``intended`` is what the node holds
        # The start's plan and the observation that starts the first interval: one step.
        self._next = None
        try:
            first = self.active.start(self._context(self.intended))
            self._carry_out(first, self.intended, 0.0, 0.0)
        except Exception as exc:  # the groups it made for a controller that never ran go
            self.keeper.undo(self.node, created)
            if isinstance(exc, ValueError):  # an option this node cannot honour (ways > L3)
                raise ControllerError(
                    f"{self.active.name} cannot start on this node: {exc}"
                ) from exc
            raise
        if self._next is None:  # the plan was refused: nothing was observed
            self.node.observe()
        self._next = None  # the first interval starts now; its end is observed next
        self.started = True

    def _context(self, allocation: Allocation, now: float = 0.0) -> ControlContext:
        controller = self.active
        tasks = None
        if controller.needs_tasks:
            tasks = {g: self.node.tasks(g) for g in self.groups}
        return ControlContext(
            capabilities=self.caps,
            groups=dict(self.groups),
            allocation=allocation,
            tasks=tasks,
            time_s=now,
            reserved_ways=self.plan_guard.reserved,
        )

    def _current(self) -> Allocation:
        """What the node holds: read back every ``resync_intervals`` intervals (and after any
        surprise); in between, what the last apply returned -- one round trip less per
        interval. A stale view cannot get an invalid plan applied: the node validates every
        apply against what it really holds, atomically, and a refusal counts as a drop."""
        self._since_read += 1
        if self.intended is None or self._stale:
            self.intended = self.node.allocation()
            self._stale, self._since_read = False, 0
        elif self._since_read >= self.cfg.resync_intervals:
            self.keeper.follow_cgroups(self.node, self.groups)
            self._read_reserved()
            return self._reassert(self.node.allocation())
        return self.intended

    def step(self) -> StepResult:
        """Advance one interval: observe (or take the observation the last interval's step
        brought), judge SLOs, decide, guard, apply -- and with the apply, when the
        interval passes at the node, let it pass and observe the next one's start."""
        snap, t0 = self._observed()
        self._follow_groups(snap)
        current = self._current()
        now = snap.timestamp
        if now < self._last_now:  # the node's clock started over (a restarted sim agent)
            self.plan_guard.forget()
        self._last_now = now
        switch = self.slo_guard.update(self._judged(snap))
        self._watch_unjudged()
        ctx = self._context(current, now)
        if switch is not None:
            self._switched(switch)
            self.target = None
        name = self.active.name
        fresh, self._fresh = self._fresh or switch is not None, False
        t1 = time.perf_counter()
        try:
            decision = self.active.start(ctx) if fresh else self.active.decide(snap, ctx)
        except NodeError:
            raise  # the agent's (an outage while a controller reads the node): run() handles it
        except Exception as exc:
            # A controller bug must not take the node down with it: keep what the node holds
            # (valid), count it, carry on; the SLO guard still watches the LC groups.
            decision = None
            log.exception(
                "controller %s failed: %s",
                name,
                exc,
                extra={"event": "controller_error", "controller": name},
            )
        decide_s = time.perf_counter() - t1
        if decided(decision):  # a slower cadence's wait is no decision to time
            self.metrics.decision_latency.labels(name).observe(decide_s)
        then = self._then()
        if decision is None:
            self.metrics.decisions.labels(name, "error").inc()
            outcome, rule = "error", None
            self._observe_next(then)
        else:
            outcome, rule = self._carry_out(decision, current, now, then)
        self._passed(then)
        if self.slo_guard.in_fallback and outcome in ("dropped", "error"):
            why = f"its plan was dropped ({rule})" if outcome == "dropped" else "it failed"
            self._fallback_failed(why, current)
        # Observe, decide and apply, whether they took one round trip or more; not the
        # interval a step let pass between its apply and its observation.
        loop_s = time.perf_counter() - t0 - self._waited
        self.metrics.loop_latency.observe(loop_s)
        self.metrics.intervals.inc()
        self.intervals += 1
        return StepResult(snap, name, outcome, decide_s, loop_s, switch, rule)

    def _judged(self, snap: Snapshot) -> dict[str, bool | None]:
        """Each LC group's SLO verdict on ``snap``, recorded with the batch groups' IPS."""
        self.metrics.track(self.groups)  # an LC group made since (by a client, a restart)
        verdicts = slo_verdicts(snap, self.groups)
        for group, violated in verdicts.items():
            if violated is not None:
                spec = self.groups[group]
                tail = snap.groups[group].latency.percentile(spec.slo.percentile)
                self.metrics.record_slo(group, violated, tail)
        for group, spec in self.groups.items():
            sample = snap.groups.get(group)
            batch = spec.kind is GroupKind.BATCH and sample is not None
            if batch and sample.instructions and snap.interval_s > 0:
                self.metrics.record_batch_ips(group, sample.instructions / snap.interval_s)
        return verdicts

    def _carry_out(
        self, decision: Decision, current: Allocation, now: float, then: float | None = None
    ) -> tuple[str, str | None]:
        """Carry out a decision: its task moves, then its plan through the guard. With
        ``then`` (seconds), the apply is a step that lets that interval pass and observes
        (kept in ``_next``); a decision without a plan still observes so."""
        name = self.active.name
        _move_tasks(self.node, decision.moves)
        plan = decision.plan
        if plan is None:
            # A rate-limited plan keeps moving toward its target until reached or replaced
            # (controllers such as static or eq decide once and then keep).
            plan = self.target
        if plan is None:
            self.metrics.decisions.labels(name, "kept").inc()
            self._observe_next(then)
            return "kept", None
        limit = not self.slo_guard.in_fallback or self.cfg.guard.limit_fallback
        screened = self.plan_guard.screen(plan, self.caps, self.groups, current, now, limit=limit)
        for what in screened.limits:
            self.metrics.limited_plans.labels(what).inc()
        self.target = plan if screened.limits and screened.dropped is None else None
        if screened.dropped is not None:
            self._observe_next(then)
            return self._dropped(name, screened.dropped, screened.error)
        if screened.plan is None:
            self.metrics.decisions.labels(name, "kept").inc()
            self._observe_next(then)
            return ("limited" if screened.limits else "kept"), None
        self.pending = screened.plan
        try:
            if then is None:
                held = self.node.apply(screened.plan)
            else:
                out = self.node.step(screened.plan, interval_s=then)
                held = out.allocation
                self._stepped(out.snapshot, out.waited_s)
        except (InvalidAllocation, GroupNotFound) as exc:  # the node saw more than we did
            self.pending = None
            self._stale = True
            rule = getattr(exc, "rule", "unknown_group")
            if rule == "exclusive_overlap":  # another tool may have taken ways meanwhile
                self._read_reserved()
            return self._dropped(name, rule, str(exc))
        self.pending = None
        self.plan_guard.committed(screened.plan, current, now)
        self.intended = held
        self.metrics.record_allocation(held, self.caps.mba)
        self.metrics.decisions.labels(name, "applied").inc()
        return ("limited" if screened.limits else "applied"), None

    def _dropped(self, name: str, rule: str, error: str) -> tuple[str, str]:
        self.metrics.dropped_plans.labels(rule).inc()
        self.metrics.decisions.labels(name, "dropped").inc()
        # every drop is counted; a controller that keeps proposing one refused plan is
        # reported once a minute, not every interval
        quiet = self.drop_log.admit((name, rule))
        if quiet is not None:
            log.warning(
                "dropped an invalid plan from %s: %s%s",
                name,
                error,
                held_back(quiet),
                extra={"event": "dropped", "controller": name, "rule": rule, "held_back": quiet},
            )
        return "dropped", rule


def _move_tasks(node: Node, moves: Mapping[str, frozenset[int]]) -> None:
    """A decision's task moves; a refused one is logged, and a task that has exited since
    the controller listed it does not keep the others of its move out (move_tasks)."""
    for group, pids in moves.items():
        try:
            exited = move_tasks(node, group, pids)
        except GroupNotFound as exc:
            log.warning("task move into %r failed: %s", group, exc)
            continue
        if exited:
            log.warning("task move into %r: no tasks %s (exited)", group, sorted(exited))

"""The online tuner: one controller driving one node through the safety guard (issue 8).

Each interval: observe -> (encode ->) decide -> guard -> apply (ARCHITECTURE.md, "Data flow";
the policy controller encodes features itself with models/features.py). On a simulated node
the tuner steps the node's clock by the interval (optionally also sleeping, ``realtime``);
on a real node it sleeps to a fixed-rate schedule.

Failure handling (issue 8, "Safety guard"):

* The agent unreachable (UNAVAILABLE, a deadline): the interval is abandoned, the tuner
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

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from agent.errors import (
    GroupExists,
    GroupNotFound,
    InvalidAllocation,
    NodeError,
    ResourceExhausted,
    UnknownTask,
)
from agent.node import Node, as_clock
from agent.types import Allocation, AllocationPlan, GroupKind, GroupSpec, Snapshot
from models.controller import ControlContext, Controller, Decision
from tuner.config import ConfigError, TunerConfig
from tuner.guard import PlanGuard, SloGuard, Switch, slo_verdicts
from tuner.metrics import TunerMetrics

log = logging.getLogger("rdtune.tuner")

# Status codes of a RemoteError meaning "the agent is not there (right now)".
OUTAGE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"})


def is_outage(exc: BaseException) -> bool:
    from agent.server.errors import RemoteError

    return isinstance(exc, RemoteError) and exc.code in OUTAGE_CODES


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


class Tuner:
    """Controller x Node with the safety guard.

    Args:
        connect: returns a connected node (a RemoteNode in production); called again after
            an outage only if ``reconnect_new`` (a RemoteNode reconnects by itself).
        controller: builds the primary controller for the node's capabilities (called once,
            after the first connection: a policy is checked against the node).
        cfg: the configuration (interval, groups, guard, fallback, retry).
        fallback: the SLO guard's fallback controller.
        metrics: where to export (a fresh registry by default).
    """

    def __init__(
        self,
        connect: Callable[[], Node],
        controller: Callable[[object, int], Controller],
        cfg: TunerConfig,
        fallback: Controller,
        metrics: TunerMetrics | None = None,
    ) -> None:
        self.cfg = cfg
        self._connect = connect
        self._build_controller = controller
        self.fallback = fallback
        self.metrics = metrics or TunerMetrics()
        self.plan_guard = PlanGuard(cfg.guard)
        self.slo_guard = SloGuard(cfg.guard.violation_intervals, cfg.guard.stable_intervals)
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
        self._moved: dict[str, set[int]] = {}  # pids moved into each configured group
        self._since_read = 0
        self.intervals = 0
        self.switches: list[Switch] = []
        self._last_now = -math.inf
        self._next_tick: float | None = None
        self.started = False  # start() has finished once: later outages reconcile

    # ------------------------------------------------------------------ state

    @property
    def active(self) -> Controller:
        return self.fallback if self.slo_guard.in_fallback else self.primary

    # ------------------------------------------------------------------ set-up

    def start(self) -> None:
        """Connect, create or adopt the configured groups, start the controller.

        Safe to call again after it failed part-way (the agent not up yet): the connection
        is kept, and nothing counts as started until the controller has started."""
        if self.node is None:
            self.node = self._connect()
        self.caps = self.node.capabilities()
        self.clock = as_clock(self.node)
        self._ensure_groups()
        self.groups = self._read_groups()
        if self.primary is None:
            self.primary = self._build_controller(self.caps, len(self.groups))
        self.baseline = self.node.allocation()
        self.intended = self.baseline
        self.metrics.agent_up.set(1)
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
        self._carry_out(self.active.start(self._context(self.baseline)), self.baseline, 0.0)
        self.node.observe()  # the first interval starts now
        self.started = True

    def _ensure_groups(self, strict: bool = True) -> None:
        """Create (or adopt) the configured groups and move their tasks in. ``strict``: an
        unreadable cgroup is a configuration error (at start); after an outage it is logged
        and the group's tasks stay where they are."""
        have = self.node.groups()
        for g in self.cfg.groups:
            spec = g.spec
            if spec.name in have:
                if have[spec.name] != spec:
                    log.warning(
                        "group %r exists as %s; adopting it as it is (configured: %s)",
                        spec.name,
                        have[spec.name],
                        spec,
                        extra={"event": "adopt_mismatch", "group": spec.name},
                    )
            else:
                # GroupExists: created meanwhile (another tuner instance starting): adopt it.
                with contextlib.suppress(GroupExists):
                    self.node.create_group(spec)
                log.info(
                    "created group %r", spec.name, extra={"event": "create", "group": spec.name}
                )
            try:
                pids = g.all_pids()
            except ConfigError as exc:
                if strict:
                    raise
                log.warning("%s", exc, extra={"event": "assign_failed", "group": spec.name})
                pids = ()
            self._move(spec.name, pids)
            if g.cpus:
                self.node.assign(spec.name, cpus=g.cpus)

    def _move(self, group: str, pids) -> None:
        """Move ``pids`` into ``group`` in one call; one at a time only when one has exited
        since it was listed."""
        pids = tuple(pids)
        try:
            if pids:
                self.node.assign(group, pids=pids)
        except UnknownTask:
            for pid in pids:
                try:
                    self.node.assign(group, pids=[pid])
                except UnknownTask as exc:
                    log.warning("group %r: %s", group, exc, extra={"event": "assign_failed"})
        self._moved[group] = set(pids)

    def _follow_cgroups(self) -> None:
        """Tasks that joined a configured cgroup since the last look (a restarted service,
        a new worker) are moved into its group; children of moved tasks follow by
        themselves (resctrl groups are inherited on fork)."""
        for g in self.cfg.groups:
            if not g.cgroup or g.spec.name not in self.groups:
                continue
            try:
                pids = set(g.all_pids())
            except ConfigError as exc:
                log.warning("%s", exc, extra={"event": "assign_failed", "group": g.spec.name})
                continue
            new = pids - self._moved.get(g.spec.name, set())
            if new:
                self._move(g.spec.name, sorted(new))
                log.info(
                    "moved %d new task(s) of %s into %r",
                    len(new),
                    g.cgroup,
                    g.spec.name,
                    extra={"event": "tasks", "group": g.spec.name, "pids": sorted(new)},
                )
            self._moved[g.spec.name] = pids

    def _read_groups(self) -> dict[str, GroupSpec]:
        """The node's groups in a stable order: known groups keep their place (a restarted
        agent may list them differently, and order-sensitive controllers would re-plan),
        new ones follow in the node's order."""
        fresh = dict(self.node.groups())
        ordered = {g: fresh[g] for g in self.groups if g in fresh}
        ordered.update(fresh)
        return ordered

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
        )

    # ------------------------------------------------------------------ one interval

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
            self._follow_cgroups()
            return self._reassert(self.node.allocation())
        return self.intended

    def step(self) -> StepResult:
        """Advance one interval: observe, judge SLOs, decide, guard, apply."""
        if self.clock is not None:
            self.clock.advance(self.cfg.interval_s)
        t0 = time.perf_counter()
        snap = self.node.observe()
        if set(snap.groups) != set(self.groups) or snap.vanished:
            self._groups_changed()
        current = self._current()
        now = snap.timestamp
        if now < self._last_now:  # the node's clock started over (a restarted sim agent)
            self.plan_guard.forget()
        self._last_now = now
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
                self.metrics.batch_ips.labels(group).set(sample.instructions / snap.interval_s)
        switch = self.slo_guard.update(verdicts)
        ctx = self._context(current, now)
        if switch is not None:
            self._switched(switch)
            self.target = None
        name = self.active.name
        t1 = time.perf_counter()
        try:
            if switch is not None:
                decision = self.active.start(ctx)
            else:
                decision = self.active.decide(snap, ctx)
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
        self.metrics.decision_latency.labels(name).observe(decide_s)
        if decision is None:
            self.metrics.decisions.labels(name, "error").inc()
            outcome, rule = "error", None
        else:
            outcome, rule = self._carry_out(decision, current, now)
        loop_s = time.perf_counter() - t0
        self.metrics.loop_latency.observe(loop_s)
        self.metrics.intervals.inc()
        self.intervals += 1
        return StepResult(snap, name, outcome, decide_s, loop_s, switch, rule)

    def _switched(self, switch: Switch) -> None:
        old, new = (
            (self.primary, self.fallback) if switch.to_fallback else (self.fallback, self.primary)
        )
        self.switches.append(switch)
        self.metrics.switches.labels(old.name, new.name).inc()
        role = "fallback" if switch.to_fallback else "primary"
        self.metrics.set_active(role, self.primary.name, self.fallback.name)
        for group in switch.groups:
            self.metrics.guard_trips.labels(group).inc()
        log.warning(
            "switching from %s to %s: %s%s",
            old.name,
            new.name,
            switch.reason,
            f" ({', '.join(switch.groups)})" if switch.groups else "",
            extra={
                "event": "switch",
                "from": old.name,
                "to": new.name,
                "reason": switch.reason,
                "tripped_by": list(switch.groups),
            },
        )

    def _carry_out(
        self, decision: Decision, current: Allocation, now: float
    ) -> tuple[str, str | None]:
        name = self.active.name
        for group, pids in decision.moves.items():
            if pids:
                try:
                    self.node.assign(group, pids=sorted(pids))
                except (UnknownTask, GroupNotFound) as exc:
                    log.warning("task move into %r failed: %s", group, exc)
        plan = decision.plan
        if plan is None:
            # A rate-limited plan keeps moving toward its target until reached or replaced
            # (controllers such as static or eq decide once and then keep).
            plan = self.target
        if plan is None:
            self.metrics.decisions.labels(name, "kept").inc()
            return "kept", None
        limit = not self.slo_guard.in_fallback or self.cfg.guard.limit_fallback
        screened = self.plan_guard.screen(plan, self.caps, self.groups, current, now, limit=limit)
        for what in screened.limits:
            self.metrics.limited_plans.labels(what).inc()
        self.target = plan if screened.limits and screened.dropped is None else None
        if screened.dropped is not None:
            return self._dropped(name, screened.dropped, screened.error)
        if screened.plan is None:
            self.metrics.decisions.labels(name, "kept").inc()
            return ("limited" if screened.limits else "kept"), None
        self.pending = screened.plan
        try:
            held = self.node.apply(screened.plan)
        except (InvalidAllocation, GroupNotFound) as exc:  # the node saw more than we did
            self.pending = None
            self._stale = True
            return self._dropped(name, getattr(exc, "rule", "unknown_group"), str(exc))
        self.pending = None
        self.plan_guard.committed(screened.plan, current, now)
        self.intended = held
        self.metrics.record_allocation(held, self.caps.mba)
        self.metrics.decisions.labels(name, "applied").inc()
        return ("limited" if screened.limits else "applied"), None

    def _dropped(self, name: str, rule: str, error: str) -> tuple[str, str]:
        self.metrics.dropped_plans.labels(rule).inc()
        self.metrics.decisions.labels(name, "dropped").inc()
        log.warning(
            "dropped an invalid plan from %s: %s",
            name,
            error,
            extra={"event": "dropped", "controller": name, "rule": rule},
        )
        return "dropped", rule

    def _groups_changed(self) -> None:
        """Groups appeared or vanished: controllers start over on the new set."""
        self.groups = self._read_groups()
        self.target = None
        self._stale = True
        log.info("groups changed: %s", sorted(self.groups), extra={"event": "groups"})
        current = self.node.allocation()
        self._carry_out(self.active.start(self._context(current)), current, self._last_now)

    # ------------------------------------------------------------------ outages

    def reconcile(self) -> None:
        """After an outage: groups back, and the node holding what the tuner last applied."""
        self.caps = self.node.capabilities()
        self.clock = as_clock(self.node)
        self._ensure_groups(strict=False)
        self.groups = self._read_groups()
        self._reassert(self.node.allocation())
        self.node.observe()  # a fresh interval

    def _reassert(self, current: Allocation) -> Allocation:
        """Put back what the tuner last applied (and an apply cut short by an outage) where
        the node holds something else: a restarted simulated agent starts over, an
        operator's manual write, a lost apply. Returns what the node holds afterwards."""
        want: dict[str, Mapping] = {}
        if self.intended is not None:
            want.update({g: a for g, a in self.intended.groups.items() if g in self.groups})
        if self.pending is not None:
            for g, per_domain in self.pending.groups.items():
                if g in self.groups:
                    want[g] = {**want.get(g, {}), **per_domain}
        self.pending = None
        plan = AllocationPlan(want)
        screened = self.plan_guard.screen(plan, self.caps, self.groups, current, 0.0, limit=False)
        self.intended = current
        if screened.dropped is not None:
            log.warning("cannot restore the last allocation: %s", screened.error)
        elif screened.plan is not None:
            self.intended = self.node.apply(screened.plan)
            log.warning(
                "the node does not hold the tuner's allocation (agent restarted?): re-applied",
                extra={"event": "restored", "groups": sorted(screened.plan.groups)},
            )
        self.metrics.record_allocation(self.intended, self.caps.mba)
        self._stale, self._since_read = False, 0
        return self.intended

    def _wait_for_agent(self, stop: threading.Event, first: BaseException) -> bool:
        """Retry with backoff until the agent answers again; False when stopped meanwhile."""
        self.metrics.agent_up.set(0)
        delay = self.cfg.retry_initial_s
        error: BaseException = first
        attempt = 0
        while not stop.is_set():
            attempt += 1
            log.warning(
                "agent unreachable (%s); retry %d in %.2g s",
                error,
                attempt,
                delay,
                extra={"event": "agent_down", "attempt": attempt},
            )
            if stop.wait(delay):
                return False
            delay = min(delay * 2, self.cfg.retry_max_s)
            try:
                if not self.started:
                    self.start()
                else:
                    self.reconcile()
            except NodeError as exc:
                if not is_outage(exc):
                    raise
                self.metrics.agent_errors.labels(type(exc).__name__).inc()
                error = exc
                continue
            self.metrics.agent_up.set(1)
            self.metrics.reconnects.inc()
            log.warning("agent reachable again", extra={"event": "agent_up"})
            return True
        return False

    # ------------------------------------------------------------------ run

    def run(self, stop: threading.Event, max_intervals: int | None = None) -> int:
        """Run until ``stop`` is set (or ``max_intervals`` intervals); returns an exit code."""
        try:
            self.start()
        except NodeError as exc:
            if not is_outage(exc):
                raise
            if not self._wait_for_agent(stop, exc):
                return 0
        realtime = self.cfg.realtime if self.cfg.realtime is not None else self.clock is None
        self._next_tick = time.monotonic()
        while not stop.is_set() and (max_intervals is None or self.intervals < max_intervals):
            if realtime and not self._sleep(stop):
                break
            try:
                self.step()
            except (ResourceExhausted, GroupNotFound) as exc:
                self.metrics.agent_errors.labels(type(exc).__name__).inc()
                log.warning("interval abandoned: %s", exc)
                self._groups_changed()
            except NodeError as exc:
                self.metrics.agent_errors.labels(type(exc).__name__).inc()
                if not is_outage(exc):
                    raise
                if not self._wait_for_agent(stop, exc):
                    break
                self._next_tick = time.monotonic()
        return 0

    def _sleep(self, stop: threading.Event) -> bool:
        self._next_tick += self.cfg.interval_s
        delay = self._next_tick - time.monotonic()
        if delay < -self.cfg.interval_s:  # fell behind (an outage, a slow agent): re-anchor
            self._next_tick = time.monotonic()
            delay = 0.0
        return not stop.wait(max(0.0, delay))

    def shutdown(self) -> None:
        """Clean exit: optionally restore the baseline allocation, then disconnect.

        An agent that is down (restarting) is retried with the usual backoff until
        ``cfg.restore_deadline_s`` has passed: leaving the tuned allocation behind would
        keep the node split for workloads the tuner no longer watches."""
        if self.node is None:
            return
        try:
            if self.cfg.restore_baseline and self.baseline is not None and self.started:
                self._restore_baseline()
        finally:
            self.node.close()

    def _restore_baseline(self) -> None:
        deadline = time.monotonic() + self.cfg.restore_deadline_s
        delay = self.cfg.retry_initial_s
        attempt = 0
        while True:
            attempt += 1
            try:
                groups = set(self.node.groups())
                plan = AllocationPlan(
                    {g: a for g, a in self.baseline.groups.items() if g in groups}
                )
                if plan.groups:
                    self.node.apply(plan)
                log.info(
                    "restored the baseline allocation",
                    extra={"event": "restore", "attempts": attempt},
                )
                return
            except NodeError as exc:
                left = deadline - time.monotonic()
                if not is_outage(exc) or left <= 0:
                    log.error(
                        "could not restore the baseline allocation: %s",
                        exc,
                        extra={"event": "restore_failed", "attempts": attempt},
                    )
                    return
                log.warning(
                    "restoring the baseline: agent unreachable (%s); retry %d in %.2g s",
                    exc,
                    attempt,
                    min(delay, left),
                    extra={"event": "restore_retry", "attempt": attempt},
                )
                time.sleep(min(delay, left))
                delay = min(delay * 2, self.cfg.retry_max_s)

"""How the tuner lives through outages and stops: the run loop, retrying an unreachable agent
with backoff and reconciling when it is back (groups recreated, the last allocation put
back), following a node that changes under it (groups, capabilities), and the clean
shutdown that optionally restores the baseline. A part of
:class:`~tuner.service.Tuner` (tuner/service.py describes the failure handling).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from agent.errors import GroupNotFound, NodeError, ResourceExhausted
from agent.node import Node, as_clock
from agent.types import Allocation, AllocationPlan, GroupSpec, Snapshot
from tuner.config import TunerConfig
from tuner.groups import GroupKeeper, respecified
from tuner.guard import PlanGuard, SloGuard
from tuner.metrics import TunerMetrics

log = logging.getLogger("rdtune.tuner")

# Status codes of a RemoteError meaning "the agent is not there (right now)".
OUTAGE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"})
# The agent's own limits it answers "retry later" for (RESOURCE_EXHAUSTED with this
# ``resource``): a peer's burst fills them for a while. Unlike the node's (CLOSIDs, RMIDs),
# waiting empties them, so the tuner backs off as in an outage instead of exiting.
AGENT_LIMITS = frozenset({"rate_limit", "waiting_steps", "streams", "sessions"})


def is_outage(exc: BaseException) -> bool:
    from agent.server.errors import RemoteError, WrongPeer

    # A peer that is not the agent (another service at the address, TLS against plaintext)
    # would be retried forever: it is the configuration's error, said at once.
    if not isinstance(exc, RemoteError) or isinstance(exc, WrongPeer):
        return False
    if exc.code == "RESOURCE_EXHAUSTED":
        return exc.details().get("resource") in AGENT_LIMITS
    return exc.code in OUTAGE_CODES


class Resilience:
    """The run loop, outages and shutdown (a part of the Tuner)."""

    # The tuner's state (tuner/service.py sets it up).
    cfg: TunerConfig
    node: Node | None
    keeper: GroupKeeper
    metrics: TunerMetrics
    plan_guard: PlanGuard
    slo_guard: SloGuard
    groups: dict[str, GroupSpec]
    baseline: Allocation | None
    intended: Allocation | None
    pending: AllocationPlan | None
    started: bool
    _next: object | None
    _realtime: bool
    _final: bool
    _stale: bool
    _last_now: float
    caps: object
    target: AllocationPlan | None
    intervals: int
    _since_read: int

    _vanished: frozenset[str] = frozenset()  # the node's vanished groups, as last handled

    def _follow_groups(self, snap: Snapshot) -> None:
        """Groups appeared, vanished, were deleted by another client or were made again
        with another spec at the node: configured ones made again, the controller
        restarted on the new set. The node keeps reporting a vanished group until it is
        made again: handled once, but a configured one (vanished or deleted) tried again
        every interval while making it fails (no CLOSID left)."""
        vanished = snap.vanished - self._vanished
        configured = {g.spec.name for g in self.keeper.groups}
        # a configured group another client deleted through the agent (not vanished: the
        # agent removed it) is made again as a vanished one is
        deleted = configured - set(snap.groups) - snap.vanished
        if set(snap.groups) != set(self.groups) or vanished or deleted or self._respecified():
            if (vanished & configured) or deleted:
                self.keeper.ensure(self.node, strict=False)
            self._groups_changed()
        self._vanished = snap.vanished - (configured - set(self.groups))

    def _respecified(self) -> bool:
        """Whether a group was deleted and made again (with another spec, kind, SLO or
        exclusive, or as another generation) by another client: its name stays, so only
        the node's group list tells.
        Read with the allocation at each resync (``resync_intervals``), not every interval:
        one round trip per interval is the tuner's budget (tuner/pacing.py)."""
        if self._since_read + 1 < self.cfg.resync_intervals:
            return False
        return bool(respecified(self.groups, self.node.groups()))

    def _read_reserved(self) -> None:
        """Read the ways another tool holds exclusively, which the plan guard trims from
        every plan: at start, when groups change, after a reconnection, at each resync and
        when the node refuses a plan as an exclusive overlap (another tool took ways)."""
        reserved = dict(self.node.reserved_ways())
        if reserved != self.plan_guard.reserved:
            log.info(
                "ways held exclusively by another tool: %s",
                {d: hex(m) for d, m in sorted(reserved.items())} or "none",
                extra={"event": "reserved_ways", "ways": reserved},
            )
            self.plan_guard.reserved = reserved

    def _groups_changed(self) -> None:
        """Groups appeared or vanished: controllers start over on the new set, and on the
        node's capabilities read again (a simulated node reset to another machine changes
        them; plans made for the old ones would be refused every interval). A node that
        is another machine now has its allocation of this moment as the baseline a stop
        restores: the tuner has not changed it yet."""
        self._next = None  # an observation of the old set of groups
        before, self.groups = self.groups, self.keeper.read(self.node, self.groups)
        # A group gone or made again (another spec or generation) is judged from scratch: a
        # violation streak or an attainment against its old group says nothing of the new.
        changed = respecified(before, self.groups)
        self.slo_guard.forget(changed)
        self.keeper.forget(changed)  # their tasks went to the default group with them
        self.metrics.track({g: s for g, s in self.groups.items() if g not in changed})
        self.metrics.track(self.groups)
        self._read_reserved()
        self.target = None
        self._stale = True
        log.info("groups changed: %s", sorted(self.groups), extra={"event": "groups"})
        current = self.node.allocation()
        caps = self.node.capabilities()
        if caps != self.caps:
            log.warning(
                "the node's capabilities changed: controllers start over on them, and a "
                "stop restores the allocation it holds now",
                extra={"event": "capabilities"},
            )
            self.caps, self.baseline = caps, current
        self._recheck_fallbacks(current)
        self._carry_out(self.active.start(self._context(current)), current, self._last_now)

    def reconcile(self) -> None:
        """After an outage: groups back, and the node holding what the tuner last applied.
        Groups that changed meanwhile (another client's exclusive group, a restarted agent
        on another scenario) are followed as a change mid-run is: the snapshots after this
        one show them already, so nothing else would."""
        self.caps = self.node.capabilities()
        self.clock = as_clock(self.node)
        self.keeper.ensure(self.node, strict=False)
        before, self.groups = self.groups, self.keeper.read(self.node, self.groups)
        _warn_lost(before, self.groups)
        self._read_reserved()
        self._reassert(self.node.allocation())
        if self.groups != before:
            self._groups_changed()
        self._next = None
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
        self.metrics.retain(set())  # what the node holds is not known while it is down
        delay = self.cfg.retry_initial_s
        error: BaseException = first
        attempt = 0
        reconnect = self.started
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
            if reconnect:  # a tuner started before its agent has lost nothing to reconnect
                self.metrics.reconnects.inc()
                log.warning("agent reachable again", extra={"event": "agent_up"})
            else:  # a tuner started before its agent: nothing was lost
                log.info("agent reachable", extra={"event": "agent_up"})
            return True
        return False

    def run(self, stop: threading.Event, max_intervals: int | None = None) -> int:
        """Run until ``stop`` is set (or ``max_intervals`` intervals); returns an exit code."""
        try:
            self.start()
        except NodeError as exc:
            if not is_outage(exc):
                raise
            self.metrics.agent_errors.labels(type(exc).__name__).inc()  # as every retry's
            if not self._wait_for_agent(stop, exc):
                return 0
        self._next_tick = time.monotonic()
        while not stop.is_set() and (max_intervals is None or self.intervals < max_intervals):
            # An interval whose start the last step observed has waited at the node already.
            if self._realtime and self._next is None and not self._sleep(stop):
                break
            # The last of ``max_intervals`` lets no further interval pass.
            self._final = max_intervals is not None and self.intervals + 1 >= max_intervals
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

    def shutdown(self) -> bool | None:
        """Clean exit: optionally restore the baseline allocation, then disconnect. Returns
        whether the baseline was restored; None when there was none to restore (not asked
        for, or the tuner never started).

        An agent that is down (restarting) is retried with the usual backoff until
        ``cfg.restore_deadline_s`` has passed: leaving the tuned allocation behind would
        keep the node split for workloads the tuner no longer watches."""
        if self.node is None:
            return None
        try:
            if self.cfg.restore_baseline and self.baseline is not None and self.started:
                return self._restore_baseline()
            return None
        finally:
            self.node.close()

    def _restore_baseline(self) -> bool:
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
                else:  # nothing of the tuner's is left to undo
                    log.warning(
                        "nothing to restore: the node has none of the groups of the baseline (%s)",
                        ", ".join(sorted(self.baseline.groups)),
                        extra={"event": "restore", "attempts": attempt, "groups": []},
                    )
                return True
            except NodeError as exc:
                left = deadline - time.monotonic()
                if not is_outage(exc) or left <= 0:
                    log.error(
                        "could not restore the baseline allocation: %s",
                        exc,
                        extra={"event": "restore_failed", "attempts": attempt},
                    )
                    return False
                log.warning(
                    "restoring the baseline: agent unreachable (%s); retry %d in %.2g s",
                    exc,
                    attempt,
                    min(delay, left),
                    extra={"event": "restore_retry", "attempt": attempt},
                )
                time.sleep(min(delay, left))
                delay = min(delay * 2, self.cfg.retry_max_s)


def _warn_lost(before: Mapping[str, GroupSpec], now: Mapping[str, GroupSpec]) -> None:
    """Groups the node lost over an outage (an agent restarted without them) are tuned no
    more: say so rather than carry on with fewer, or none, in silence."""
    lost = sorted(set(before) - set(now))
    if not lost:
        return
    log.warning(
        "the node no longer has group(s) %s (agent restarted without them?)%s",
        ", ".join(lost),
        "; it has none of the tuner's groups: nothing to tune" if not now else "",
        extra={"event": "groups_lost", "groups": lost},
    )

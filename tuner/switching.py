"""The SLO guard's side of the tuner: controller switches, and the fallback candidates
checked again whenever they may have stopped being able to serve. A part of
:class:`~tuner.service.Tuner`.

The fallback is chosen at start from the configured candidates (:func:`rehearse`). Groups
that appear later (another client's exclusive group) can make every plan it makes invalid,
and a fallback whose plans are dropped protects nothing while the guard reports it in
charge. So the candidates are checked again when the groups change, and a fallback in
charge whose plan is dropped (or that fails) hands over to the next candidate that can
serve; eq, which keeps every group's ways apart, is the last resort.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from agent.errors import NodeError
from agent.node import Node
from agent.types import Allocation, GroupSpec
from models import catalogue
from models.catalogue import shares_exclusive
from models.controller import ControlContext, Controller
from models.setup import ControllerError
from tuner.config import TunerConfig
from tuner.guard import SloGuard, Switch, SwitchLog
from tuner.metrics import TunerMetrics

log = logging.getLogger("rdtune.tuner")

# The fallback of last resort: it keeps every group's ways apart, so no exclusive group
# makes its plans invalid.
LAST_RESORT = "eq"


class Switching:
    """Controller switches and fallback candidates (a part of the Tuner)."""

    # The tuner's state (tuner/service.py sets it up).
    cfg: TunerConfig
    node: Node | None
    metrics: TunerMetrics
    slo_guard: SloGuard
    switches: SwitchLog
    groups: dict[str, GroupSpec]
    primary: Controller | None
    fallback: Controller
    _fallbacks: list[Controller]
    _fresh: bool  # the controller in charge starts (not decides) at the next interval

    _context: Callable[..., ControlContext]
    _last_resort: Controller | None = None

    def _candidates(self) -> list[Controller]:
        """The configured fallback candidates, then eq as the last resort."""
        if self._last_resort is None and not any(c.name == LAST_RESORT for c in self._fallbacks):
            self._last_resort = catalogue.construct(LAST_RESORT, self.cfg.interval_s)
        return [*self._fallbacks, *filter(None, [self._last_resort])]

    def _recheck_fallbacks(self, allocation: Allocation) -> None:
        """After the groups changed: the first candidate that can serve them, as at start
        (one the old groups ruled out may serve again)."""
        old = self.fallback
        try:
            new = rehearse(self._candidates(), self._context(allocation))
        except ControllerError as exc:
            log.error("%s", exc, extra={"event": "fallback_unusable", "controller": old.name})
            return
        if new is not old:
            why = (
                shares_exclusive(old.name, self.groups) or f"{new.name} can serve the groups again"
            )
            self._hand_over(old, new, why)

    def _fallback_failed(self, why: str, allocation: Allocation) -> None:
        """The fallback in charge had its plan dropped or failed: the next candidate that
        can serve takes over, starting at the next interval. The last resort stays (each of
        its drops is counted and logged already)."""
        candidates = self._candidates()
        old = self.fallback
        rest = candidates[candidates.index(old) + 1 :] if old in candidates else []
        if not rest:
            return
        try:
            new = rehearse(rest, self._context(allocation))
        except ControllerError:
            return
        self._fresh = True
        self._hand_over(old, new, why)

    def _hand_over(self, old: Controller, new: Controller, why: str) -> None:
        self.fallback = new
        in_charge = self.slo_guard.in_fallback
        self.metrics.set_active("fallback" if in_charge else "primary", self.primary.name, new.name)
        if in_charge:
            self.metrics.switches.labels(old.name, new.name).inc()
        # An error when a fallback could not protect; a preferred one back is no news.
        order = self._candidates()
        worse = old not in order or order.index(new) > order.index(old)
        log.log(
            logging.ERROR if worse else logging.WARNING,
            "fallback %s replaced by %s: %s",
            old.name,
            new.name,
            why,
            extra={"event": "fallback_changed", "from": old.name, "to": new.name, "why": why},
        )

    def _watch_unjudged(self) -> None:
        """Export each LC group's unjudged intervals in a row; warn once when the guard has
        been blind to one for as long as a switch back takes."""
        blind = self.slo_guard.stable_intervals
        for group, intervals in self.slo_guard.unjudged.items():
            self.metrics.record_unjudged(group, intervals)
            if intervals == blind:
                log.warning(
                    "LC group %s: no request judged for %d intervals (latency feed down, or "
                    "the service stalled?): the SLO guard cannot protect it",
                    group,
                    intervals,
                    extra={"event": "slo_unjudged", "group": group, "intervals": intervals},
                )

    def _switched(self, switch: Switch) -> None:
        old, new = (
            (self.primary, self.fallback) if switch.to_fallback else (self.fallback, self.primary)
        )
        self.switches.add(switch)
        self.metrics.stable_intervals.set(self.slo_guard.needed)
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


def rehearse(candidates: Sequence[Controller], ctx: ControlContext) -> Controller:
    """The first of ``candidates`` that can control the node ``ctx`` describes: one that
    would not share an exclusive group's ways (the kernel refuses such plans), started
    once, its decision dropped. A fallback that cannot (a static allocation's LC group
    missing) is refused at start, not found out when the SLO guard trips, the LC groups
    missing their SLOs."""
    problems = []
    for fallback in candidates:
        shared = shares_exclusive(fallback.name, ctx.groups)
        if shared:  # its start may keep them apart, a later plan would not
            problems.append(f"{fallback.name}: {shared}")
            continue
        try:
            fallback.start(ctx)
            return fallback
        except NodeError:
            raise
        except Exception as exc:
            problems.append(f"{fallback.name}: {exc}")
    if len(candidates) == 1:
        name, _, why = problems[0].partition(": ")
        raise ControllerError(f"the fallback controller {name} cannot control this node: {why}")
    raise ControllerError(f"no fallback controller can control this node: {'; '.join(problems)}")

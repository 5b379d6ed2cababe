"""How the tuner's intervals pass: where each interval's observation comes from and how
the interval between apply and observation passes (a part of :class:`~tuner.service.Tuner`).

Each interval's apply and the observation that starts the next travel as one
:meth:`agent.node.Node.step` (one message to a remote agent, docs/AGENT.md "Steps"): the
plan, then the interval's passing -- the simulated clock's advance, or on a real node the
wait until the next tick, kept by the agent -- then the observation. So an interval costs
one round trip, the plan takes effect as soon as it is decided, and the observation covers
exactly the interval since the previous one. A plan the node refuses brings no
observation: the next interval then lets its time pass and observes by itself. When a
simulated node is also paced by the wall clock (``realtime``), ``step()`` is driven by hand
on a wall-clock node, or the run's last interval has come, the interval passes outside the
node and apply and observe stay separate calls.
"""

from __future__ import annotations

import time

from agent.node import Clock, Node
from agent.types import Snapshot
from tuner.config import TunerConfig


class Pacing:
    """The interval's observation and passing (a part of the Tuner)."""

    cfg: TunerConfig
    node: Node | None
    clock: Clock | None
    _next_tick: float | None

    def _init_pacing(self) -> None:
        self._realtime = False  # paced by the wall clock (run() sleeps, or the step waits)
        # The observation that starts the next interval, taken by this interval's step
        # (None: the next interval observes by itself), and the time that step spent
        # letting the interval pass (not the tuner's latency).
        self._next: Snapshot | None = None
        self._waited = 0.0
        self._final = False  # this interval is the run's last: observe no next one

    def _observed(self) -> tuple[Snapshot, float]:
        """This interval's observation -- the one the last interval's step brought, else
        let the interval pass (a simulated clock's) and observe -- and the time the
        tuner's own work on the interval starts (perf_counter)."""
        snap, self._next = self._next, None
        self._waited = 0.0
        if snap is None:
            if self.clock is not None:
                self.clock.advance(self.cfg.interval_s)
            t0 = time.perf_counter()
            return self.node.observe(), t0
        return snap, time.perf_counter()

    def _then(self) -> float | None:
        """The interval the step carrying this interval's apply lets pass before observing
        the next one's start (simulated seconds, or wall-clock seconds to the next tick);
        None when the interval passes outside the node or no interval follows."""
        if self._final:
            return None
        if self.clock is not None:
            return None if self._realtime else self.cfg.interval_s
        if self._realtime and self._next_tick is not None:
            return max(0.0, self._next_tick + self.cfg.interval_s - time.monotonic())
        return None

    def _stepped(self, snapshot: Snapshot, waited_s: float) -> None:
        """Keep the observation a step took for the next interval."""
        self._next, self._waited = snapshot, waited_s

    def _passed(self, then: float | None) -> None:
        """After the interval's apply: a step that waited at the node until the next tick
        moves the wall-clock schedule on by one."""
        if then is None or self._next is None:
            return
        if self.clock is None and self._next_tick is not None:
            self._next_tick += self.cfg.interval_s
            now = time.monotonic()
            if self._next_tick < now - self.cfg.interval_s:  # fell behind: re-anchor
                self._next_tick = now

    def _observe_next(self, then: float | None) -> None:
        """No plan this interval: when the interval passes at the node, a step without a
        plan lets it pass and observes."""
        if then is not None:
            out = self.node.step(None, interval_s=then)
            self._stepped(out.snapshot, out.waited_s)

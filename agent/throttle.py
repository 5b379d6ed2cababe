"""Logging that a repeated event cannot flood: :class:`LogThrottle` lets one report per key
through every ``every_s`` seconds and counts the ones it holds back, so the next report
can say how many there were. The agent's reports of undecodable frames (per client host)
and the tuner's of dropped plans (per controller and rule) go through one."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Hashable

# Keys kept at most; beyond, the keys not reported within a period are forgotten (a
# hostile peer naming a new host each time must not grow it without end).
MAX_KEYS = 4096


class LogThrottle:
    """At most one report per key every ``every_s`` seconds (default a minute).

    Args:
        every_s: the least time between two reports of one key.
        clock: monotonic seconds (a test's own clock).
    """

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._last: dict[Hashable, tuple[float, int]] = {}
        self._lock = threading.Lock()
        self.total = 0

    def admit(self, key: Hashable) -> int | None:
        """The number of reports of ``key`` held back since its last one, when this one
        is to be made; None when it is to be held back (and counted)."""
        now = self._clock()
        with self._lock:
            self.total += 1
            last, quiet = self._last.get(key, (-math.inf, 0))
            if now - last < self.every_s:
                self._last[key] = (last, quiet + 1)
                return None
            if len(self._last) > MAX_KEYS:
                self._last = {k: v for k, v in self._last.items() if now - v[0] < self.every_s}
            self._last[key] = (now, 0)
            return quiet


def held_back(quiet: int) -> str:
    """`` (N more since the last report)`` for a report after ``quiet`` held back; ""."""
    return f" ({quiet} more since the last report)" if quiet else ""

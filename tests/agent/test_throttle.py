"""LogThrottle: one report per key and period, the held-back ones counted."""

from __future__ import annotations

from agent.throttle import MAX_KEYS, LogThrottle, held_back


def test_one_report_per_key_and_period_with_the_count_held_back() -> None:
    now = [0.0]
    throttle = LogThrottle(60.0, clock=lambda: now[0])
    assert throttle.admit("a") == 0  # the first is reported
    assert throttle.admit("a") is None and throttle.admit("a") is None
    assert throttle.admit("b") == 0  # another key has its own period
    now[0] = 59.9
    assert throttle.admit("a") is None
    now[0] = 60.0
    assert throttle.admit("a") == 3  # three held back since the last report
    assert throttle.admit("a") is None
    assert throttle.total == 7
    assert held_back(3) == " (3 more since the last report)" and held_back(0) == ""


def test_keys_not_heard_of_for_a_period_are_forgotten_past_the_bound() -> None:
    now = [0.0]
    throttle = LogThrottle(1.0, clock=lambda: now[0])
    for k in range(MAX_KEYS + 1):
        throttle.admit(k)
    now[0] = 5.0
    throttle.admit("new")  # over the bound: the stale keys go
    assert len(throttle._last) == 1

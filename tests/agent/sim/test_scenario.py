"""Load schedules (agent/sim/scenario.py): a bursty profile's breakpoints, drawn in blocks,
are the one-draw-at-a-time loop's to the bit, and leave the node's random stream where that
loop left it (every later draw of the node, its noise, comes from the same stream)."""

from __future__ import annotations

import numpy as np
import pytest

from agent.sim.scenario import LoadProfile


def _one_at_a_time(p: LoadProfile, rng: np.random.Generator, horizon_s: float):
    """The schedule as first written: one exponential draw per gap and per burst."""
    t = 0.0
    times, levels = [0.0], [p.level]
    while t < horizon_s:
        t += float(rng.exponential(p.gap_s))
        times.append(t)
        levels.append(p.level * p.burst_factor)
        t += float(rng.exponential(p.burst_s))
        times.append(t)
        levels.append(p.level)
    return times, levels


@pytest.mark.parametrize(
    ("gap_s", "burst_s", "horizon_s"),
    [(10.0, 1.0, 3600.0), (2.0, 3.0, 96.0), (0.5, 0.1, 50.0), (30.0, 30.0, 5.0), (10.0, 1.0, 0.0)],
)
def test_bursts_are_the_one_at_a_time_loops(gap_s: float, burst_s: float, horizon_s: float):
    p = LoadProfile("bursty", 0.4, "utilization", gap_s=gap_s, burst_s=burst_s, burst_factor=2.5)
    for seed in range(25):
        rng, ref = np.random.default_rng(seed), np.random.default_rng(seed)
        schedule = p.schedule(rng, horizon_s)
        times, levels = _one_at_a_time(p, ref, horizon_s)
        assert schedule._times == times and schedule._levels == levels
        assert times[-1] >= horizon_s or horizon_s <= 0
        assert rng.standard_normal(8).tolist() == ref.standard_normal(8).tolist()
        for t in (0.0, horizon_s / 3, horizon_s - 1e-9):  # the levels read back
            if t >= 0:
                i = int(np.searchsorted(times, t, side="right")) - 1
                assert schedule.level(t) == levels[i]

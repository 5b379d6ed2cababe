"""Model internals whose speed-ups must not move a bit, or only within the solver's
tolerance (agent/sim/model.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from agent.sim import SimNode
from agent.sim.model import Model, _workloads
from agent.sim.scenario import LoadProfile, get_scenario


@pytest.mark.parametrize("shape", [(1, 4, 11), (3, 6, 20), (256, 6, 20)])
def test_sums_over_workloads_add_the_rows_in_order(shape: tuple[int, int, int]) -> None:
    """Both of `_workloads`' paths (a reduction at a few nodes, einsum on batches) add each
    way's rows in order: the same floats as the running sum, so a batch's node and a single
    node get the same occupancy step."""
    x = np.random.default_rng(0).random(shape) * 10.0 ** np.arange(shape[1])[:, None]
    want = x[:, :1].copy()
    for i in range(1, shape[1]):
        want = want + x[:, i : i + 1]
    np.testing.assert_array_equal(_workloads(x), want)


def _drifting_node() -> SimNode:
    """The default mix with memcached's load on a 60 s diurnal cycle: every step moves."""
    scn = get_scenario("default")
    lc = dataclasses.replace(
        scn.workloads[0],
        load=LoadProfile("diurnal", 0.4, "utilization", amplitude=0.5, period_s=60.0),
    )
    node = SimNode(dataclasses.replace(scn, workloads=(lc, *scn.workloads[1:])), seed=0)
    node.advance(2.0)
    return node


def test_carried_correction_lands_within_the_tolerance_of_the_plain_start() -> None:
    """Model.advance's first guess (the previous step's correction) changes where the
    iteration starts, not what it solves: from the guess and from the start's miss ratio
    alike it stops within ``tol`` of the root, and the residual falls at least as fast as
    the miss ratio rises (dr/dm <= -1), so the two roots are within 2 x tol."""
    node = _drifting_node()
    eng = node._engine
    tol, dt = 2e-5, node.interval_s
    guessed = 0
    for _ in range(20):
        eng._refresh(eng.t + 0.5 * dt, None)
        inp = eng._inputs(None)
        sol = eng.model.solve(inp, eng.occ, eng.dyn)
        guess = eng._correction.copy()
        guessed += int(np.count_nonzero(guess))
        _, _, plain = eng.model.advance(eng.occ, inp, sol, eng.dyn, dt, tol=tol)
        _, _, carried = eng.model.advance(eng.occ, inp, sol, eng.dyn, dt, tol=tol, guess=guess)
        np.testing.assert_allclose(carried, plain, rtol=0, atol=2 * tol)
        node.advance(dt)
    assert guessed  # the guesses were used


def test_carried_correction_saves_occupancy_evaluations_on_a_drifting_load(monkeypatch) -> None:
    """On a load that drifts, the previous step's correction starts the occupancy solver
    next to the root (one evaluation most steps); from the start's miss ratio it needs
    three or four."""
    calls = [0]
    step_occupancy = Model._step_occupancy

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return step_occupancy(self, *args, **kwargs)

    monkeypatch.setattr(Model, "_step_occupancy", counted)
    per_step = {}
    for carried in (True, False):
        node = _drifting_node()
        calls[0] = 0
        for _ in range(50):
            if not carried:
                node._engine._correction[:] = 0.0
            node.advance(node.interval_s)
        per_step[carried] = calls[0] / 50
    assert per_step[True] < 2.0 < 3.0 <= per_step[False], per_step

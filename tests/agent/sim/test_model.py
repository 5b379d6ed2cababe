"""Model internals whose speed-ups must not move a bit, or only within the solver's
tolerance (agent/sim/model.py, agent/sim/kernel.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from agent.sim import SimNode, kernel
from agent.sim.scenario import LoadProfile, get_scenario


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
    advance = kernel.advance

    def counted(*args):
        *out, evaluations = advance(*args)
        calls[0] += int(evaluations.sum())
        return (*out, evaluations)

    monkeypatch.setattr(kernel, "advance", counted)
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


def test_a_models_rows_solve_as_the_whole_model_does() -> None:
    """Model.take's view reads its own rows of the packed parameters, also when the whole
    model has packed them first, and the whole model's solves of some ``rows`` read them in
    place: solving nodes 2 and 0 of a batch of three different mixes either way gives
    those nodes' numbers of the whole batch, bit for bit."""
    from agent.sim.batch import SimBatch

    names = ("default", "copart_h_both", "more_lc_than_closids_epyc")
    eng = SimBatch([get_scenario(name) for name in names], [0, 1, 2]).engine
    inp = eng.inputs()
    whole = eng.model.solve(inp, eng.occ, eng.dyn)
    rows = np.array([2, 0])
    part = eng.model.take(rows).solve(inp.take(rows), eng.occ[rows], eng.dyn.take(rows))
    for name, value in vars(part).items():
        np.testing.assert_array_equal(value, getattr(whole, name)[rows], err_msg=name)
    new, eta, m = eng.model.advance(eng.occ, inp, whole, eng.dyn, 0.1)
    new_p, eta_p, m_p = eng.model.take(rows).advance(
        eng.occ[rows], inp.take(rows), part, eng.dyn.take(rows), 0.1
    )
    np.testing.assert_array_equal(new_p, new[rows])
    np.testing.assert_array_equal(eta_p, eta[rows])
    np.testing.assert_array_equal(m_p, m[rows])
    in_place = eng.model.solve(inp, eng.occ, eng.dyn, rows=rows)
    for name, value in vars(in_place).items():
        np.testing.assert_array_equal(value, getattr(whole, name)[rows], err_msg=name)
    guess = np.full((len(rows), eng.model.n), 1e-3)  # a carried correction, per row
    stepped = eng.model.advance(eng.occ, inp, in_place, eng.dyn, 0.1, guess=guess, rows=rows)
    taken = eng.model.take(rows).advance(
        eng.occ[rows], inp.take(rows), part, eng.dyn.take(rows), 0.1, guess=guess
    )
    for got, want in zip(stepped, taken, strict=True):
        np.testing.assert_array_equal(got, want)


def test_padding_workloads_are_skipped_without_moving_a_bit(monkeypatch) -> None:
    """A batch pads every node to its widest mix; the solves skip a node's padding rows
    (Model._counts), which draw nothing and hold nothing: a batch of random mixes of 1-5
    workloads padded to 16 steps through allocation changes and changing loads exactly as
    when every row is solved."""
    from agent.sim.batch import SimBatch
    from agent.sim.mixes import random_scenario
    from agent.sim.model import Model

    scns = [random_scenario(seed) for seed in (0, 1, 2, 3, 5, 7, 8, 14)]
    rows = np.arange(len(scns))
    runs = []
    for solve_padding in (False, True):
        if solve_padding:
            monkeypatch.setattr(Model, "_counts", lambda self: np.full(self.B, self.n))
        batch = SimBatch(scns, list(rows), max_workloads=16)
        assert (batch.engine.model._counts() < 16).all() != solve_padding
        rng = np.random.default_rng(4)
        seen = []
        for step in range(10):
            if step % 3 == 0:  # each group's mask shrunk by 0-2 ways
                gm = batch.gmask >> rng.integers(0, 3, batch.gmask.shape)
                gm = np.where(batch.gmask > 0, np.maximum(gm, 1), 0)
                batch.set_allocation(rows, gm, batch.gmb.copy(), np.ones(len(rows), dtype=bool))
            batch.advance(0.3)
            obs = batch.observe()
            seen += [obs.counters, obs.latency_ms, batch.engine.occ.copy()]
        runs.append(seen)
    for skipped, solved in zip(*runs, strict=True):
        np.testing.assert_array_equal(skipped, solved)


def _steady_step_by_step(model, inp, occ, iters):
    """Model.steady as it was written before it was compiled: one batched solve and
    advance per step, converged nodes leaving the batch. The compiled loop must match it."""
    from agent.sim.model import Dynamics

    dyn = model.start()
    sol = model.solve(inp, occ, dyn)
    tol, big_move = model.steady_tolerances()
    dt = np.full((model.B, 1), 0.1)
    out_occ, out_sol, out_eta = occ.copy(), sol.take(np.arange(model.B)), dyn.eta.copy()
    rows = np.arange(model.B)
    for _ in range(iters):
        dyn = Dynamics(sol.utilization, sol.rho, dyn.eta)
        new, eta, _ = model.advance(occ, inp, sol, dyn, dt)
        moved = np.abs(new - occ).max(axis=(1, 2))
        occ = np.where(dt[:, :, None] < 1.0, new, 0.5 * (occ + new))
        dyn.eta = eta
        sol = model.solve(inp, occ, dyn, tol=1e-10)
        done = moved < tol
        if done.any():
            at = rows[done]
            out_occ[at], out_eta[at] = occ[done], eta[done]
            out_sol.put(at, sol.take(done))
            if done.all():
                rows = rows[:0]
                break
            keep = np.flatnonzero(~done)
            model, inp, rows = model.take(keep), inp.take(keep), rows[keep]
            occ, sol, dyn, dt = occ[keep], sol.take(keep), dyn.take(keep), dt[keep]
            moved, tol, big_move = moved[keep], tol[keep], big_move[keep]
        big = moved > big_move
        dt = np.where(big[:, None], np.maximum(dt * 0.5, 0.1), np.minimum(dt * 1.5, 100.0))
    if len(rows):
        out_occ[rows], out_eta[rows] = occ, dyn.eta
        out_sol.put(rows, sol)
    return out_occ, out_sol, out_eta


@pytest.mark.parametrize("iters", [3, 30])
def test_the_compiled_steady_state_is_the_step_by_step_loop(iters: int) -> None:
    """kernel.steady runs each node's steady-state loop to its end in one call; the numbers
    are those of the loop over batched steps, bit for bit, for nodes that converge and for
    nodes that run out of iterations (these mixes take 2 to 115 steps, and mix 40 never
    settles; from step 7 the steps pass 1 s and the jumps are halved), from empty caches and from
    a cache already holding something."""
    from agent.sim.batch import SimBatch
    from agent.sim.mixes import random_scenario

    scns = [random_scenario(seed) for seed in (0, 1, 2, 3, 40, 46, 64, 126, 159)]
    eng = SimBatch(scns, list(range(len(scns)))).engine
    inp = eng.inputs()
    for occ in (np.zeros_like(eng.occ), eng.occ * 0.5):
        want_occ, want_sol, want_eta = _steady_step_by_step(eng.model, inp, occ, iters)
        got_occ, got_sol, got_dyn = eng.model.steady(inp, occ, iters=iters)
        np.testing.assert_array_equal(got_occ, want_occ)
        np.testing.assert_array_equal(got_dyn.eta, want_eta)
        for name, value in vars(want_sol).items():
            np.testing.assert_array_equal(getattr(got_sol, name), value, err_msg=name)
    m = eng.model
    *_, taken = kernel.steady(
        *m.occupancy_args(inp, np.zeros_like(eng.occ)), *m.steady_tolerances(), iters
    )
    assert (taken > iters).any() and (taken <= iters).any()  # both kinds of node were met


def test_hold_cap_of_some_rows_is_their_rows_of_all() -> None:
    """Model.hold_cap of nodes ``rows`` (what the engine recomputes after an allocation
    moved) reads the whole model's parameters at those rows: their rows of the whole
    batch's answer, bit for bit, and the expected lines a set keeps of a Poisson number
    hashed to it, summed over the mask's ways only."""
    import math

    from agent.sim.batch import SimBatch
    from agent.sim.mixes import random_scenario

    eng = SimBatch([random_scenario(seed) for seed in range(12)], list(range(12))).engine
    m, rng = eng.model, np.random.default_rng(3)
    nways = rng.integers(1, m.W + 1, size=eng.nways.shape).astype(float)
    ws = eng.mult[:, :, 1] * rng.uniform(0.3, 3.0, size=nways.shape)
    whole = m.hold_cap(nways, ws)
    rows = np.array([7, 2, 11])
    np.testing.assert_array_equal(m.hold_cap(nways[rows], ws[rows], rows), whole[rows])
    machine, workloads, _ = m._packed()
    for b in range(m.B):
        for i in range(m.n):
            fp = workloads[b, i, kernel.FP] * ws[b, i]
            lam = max(fp / machine[b, kernel.WAY_BYTES], 1e-12)
            cdf = np.cumsum([math.exp(-lam) * lam**k / math.factorial(k) for k in range(m.W)])
            held = np.clip(1.0 - cdf[: int(nways[b, i])], 0.0, 1.0).sum()
            want = min(machine[b, kernel.WAY_BYTES] * held, fp)
            assert whole[b, i] == pytest.approx(want, rel=1e-9, abs=1e-6)

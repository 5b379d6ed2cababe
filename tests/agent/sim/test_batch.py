"""SimBatch: N nodes stepped as one array pass match N SimNodes step by step.

Same scenarios and seeds on both sides (different mixes, presets, load profiles), the same
random allocation plans applied every few steps (through ``SimNode.apply``, validated, on
one side; as group mask and MB arrays on the other), some intervals cut at odd lengths,
and nodes reset mid-run to other scenarios: every counter, occupancy and LC latency figure
of every group must agree to a tight tolerance (the request counts exactly: each LC
service draws from its own stream on both sides).
"""

from __future__ import annotations

import numpy as np
import pytest

from agent.errors import NodeError
from agent.sim import SimNode
from agent.sim.batch import OCC_UNIT, SimBatch
from agent.sim.mixes import random_scenario
from agent.sim.scenario import get_scenario
from agent.types import AllocationPlan, GroupAllocation, MbaMode, Snapshot

RTOL = 1e-7


def _scenarios() -> list:
    named = ["default", "more_lc_than_closids_epyc", "more_lc_than_closids_e5v3"]
    # random mixes on every preset, with constant, step, diurnal and bursty loads
    seeds = [0, 1, 2, 3, 5, 7, 8, 14, 21, 27, 35]
    return [get_scenario(n) for n in named] + [random_scenario(s) for s in seeds]


def _random_plan(node: SimNode, rng: np.random.Generator) -> AllocationPlan:
    """Valid allocations for a random subset of the node's groups (overlaps allowed)."""
    caps = node.capabilities()
    names = list(node.groups())
    chosen = [g for g in names if rng.random() < 0.7]
    per = {}
    for g in chosen:
        ways, least = caps.l3.num_ways, max(1, caps.l3.min_cbm_bits)
        k = int(rng.integers(least, ways + 1))
        mask = ((1 << k) - 1) << int(rng.integers(0, ways - k + 1))
        mb = None
        if caps.mba is not None and caps.mba.mode is not MbaMode.MBPS:
            mb = int(rng.choice(caps.mba.levels()))
        per[g] = GroupAllocation(l3_mask=mask, mb=mb)
    return AllocationPlan.uniform(per)


def _compare(snap: Snapshot, batch: SimBatch, b: int, obs) -> None:
    names = list(snap.groups)
    assert names == [s.name for s in batch.group_specs[b]]
    assert snap.interval_s == pytest.approx(obs.interval_s[b], rel=1e-12)
    for j, name in enumerate(names):
        s = snap.groups[name]
        got = obs.counters[b, j]
        want = [s.instructions, s.cycles, s.llc_references, s.llc_misses, s.memory_bytes]
        np.testing.assert_allclose(got, want, rtol=RTOL, err_msg=f"node {b} group {name}")
        assert abs(obs.occupancy[b, j] - s.llc_occupancy_bytes) <= OCC_UNIT
        if s.latency is None:
            assert np.isnan(obs.latency_count[b, j])
            continue
        assert obs.latency_count[b, j] == s.latency.count, f"node {b} group {name}"
        want = [s.latency.p50_ms, s.latency.p95_ms, s.latency.p99_ms, s.latency.p999_ms]
        np.testing.assert_allclose(obs.latency_ms[b, j], want, rtol=RTOL, equal_nan=True)


def _observed(scns: list, first_seed: int) -> tuple[list[SimNode], SimBatch]:
    """One SimNode per scenario and a SimBatch of the same (seeds from ``first_seed``), each
    observed once so that the next observation covers the same interval on both."""
    seeds = list(range(first_seed, first_seed + len(scns)))
    nodes = [SimNode(s, seed) for s, seed in zip(scns, seeds, strict=True)]
    batch = SimBatch(scns, seeds, max_workloads=16)
    for node in nodes:
        node.observe()
    batch.observe()
    return nodes, batch


def _apply(batch: SimBatch, b: int, node: SimNode) -> bool:
    """Hand node ``b`` of the batch what the SimNode holds now; True when it changed."""
    alloc = node.allocation()
    domain = node.capabilities().domains[0]
    gmask = batch.gmask[b].copy()
    gmb = batch.gmb[b].copy()
    for j, spec in enumerate(batch.group_specs[b]):
        a = alloc.get(spec.name, domain)
        gmask[j] = batch.cbm[b] if a.l3_mask is None else a.l3_mask
        gmb[j] = np.nan if a.mb is None else a.mb
    moved = not (
        np.array_equal(gmask, batch.gmask[b]) and np.allclose(gmb, batch.gmb[b], equal_nan=True)
    )
    batch.set_allocation(np.array([b]), gmask[None], gmb[None], np.array([moved]))
    return moved


@pytest.mark.parametrize("interval", [0.1, 1.0])
def test_batched_nodes_match_single_nodes_step_by_step(interval: float) -> None:
    nodes, batch = _observed(_scenarios(), first_seed=100)
    rng = np.random.default_rng(7)
    for step in range(12):
        if step % 3 == 1:
            for b, node in enumerate(nodes):
                plan = _random_plan(node, rng)
                if plan.groups:
                    node.apply(plan)
                _apply(batch, b, node)
        dt = interval if step % 4 else interval * 0.37  # odd lengths: a partial model step
        for node in nodes:
            node.advance(dt)
        batch.advance(dt)
        obs = batch.observe()
        for b, node in enumerate(nodes):
            _compare(node.observe(), batch, b, obs)


def test_reset_nodes_mid_run_match_fresh_nodes() -> None:
    """Nodes reset to other scenarios (other presets, more workloads) while the others
    run on: each matches a SimNode built for its new scenario and seed."""
    scns = [random_scenario(s) for s in range(4)]
    batch = SimBatch(scns, [1, 2, 3, 4], max_workloads=16, max_ways=20)
    nodes = [SimNode(s, seed) for s, seed in zip(scns, [1, 2, 3, 4], strict=True)]
    for _ in range(3):
        batch.advance(0.5)
        for node in nodes:
            node.advance(0.5)
    fresh = {1: (get_scenario("more_lc_than_closids_epyc"), 41), 3: (random_scenario(77), 43)}
    batch.reset(list(fresh), [f[0] for f in fresh.values()], [f[1] for f in fresh.values()])
    for b, (scn, seed) in fresh.items():
        nodes[b] = SimNode(scn, seed)
    obs = batch.observe()
    for b, node in enumerate(nodes):
        snap = node.observe()
        if b in fresh:
            assert obs.interval_s[b] == 0.0 == snap.interval_s
            _compare(snap, batch, b, obs)
    for _ in range(4):
        batch.advance(0.3)
        for node in nodes:
            node.advance(0.3)
        obs = batch.observe()
        for b, node in enumerate(nodes):
            _compare(node.observe(), batch, b, obs)


def test_a_node_stepped_alone_does_not_move_the_others() -> None:
    scns = [random_scenario(s) for s in (5, 6)]
    batch = SimBatch(scns, [5, 6])
    batch.advance(0.4, rows=np.array([0]))
    assert batch.t.tolist() == [0.4, 0.0]
    obs = batch.observe(np.array([1]))
    assert obs.interval_s.tolist() == [0.0]
    assert np.all(obs.counters == 0.0)


def test_too_large_a_scenario_for_the_padding_is_refused() -> None:
    batch = SimBatch([random_scenario(1)], [1])
    with pytest.raises(ValueError, match="padding"):
        batch.reset([0], [get_scenario("sixteen_groups")], [1])


def test_plans_applied_together_match_single_nodes_applying_them() -> None:
    """``apply_many`` (the vector env's episode baselines) is ``SimNode.apply`` per node."""
    nodes, batch = _observed(_scenarios()[:7], first_seed=300)
    rng = np.random.default_rng(3)
    for _ in range(4):
        plans = [_random_plan(node, rng) for node in nodes]
        rows = [b for b, plan in enumerate(plans) if plan.groups]
        for b in rows:
            nodes[b].apply(plans[b])
        batch.apply_many(rows, [plans[b] for b in rows])
        for node in nodes:
            node.advance(1.0)
        batch.advance(1.0)
        obs = batch.observe()
        for b, node in enumerate(nodes):
            _compare(node.observe(), batch, b, obs)


def test_an_invalid_plan_among_many_leaves_the_ones_before_it_applied() -> None:
    scns = [get_scenario("default")] * 3
    batch = SimBatch(scns, [1, 2, 3])
    name = batch.group_specs[0][0].name
    good = AllocationPlan.uniform({name: GroupAllocation(l3_mask=0b11)})
    bad = AllocationPlan.uniform({name: GroupAllocation(l3_mask=0)})  # no way at all
    before = batch.gmask.copy()
    with pytest.raises(NodeError):
        batch.apply_many([0, 1, 2], [good, bad, good])
    assert batch.gmask[0, 0] == 0b11
    np.testing.assert_array_equal(batch.gmask[1:], before[1:])
    masks = batch.engine.masks
    assert masks[0, 0, :2].all() and not masks[0, 0, 2:].any()  # pushed to the workloads


@pytest.mark.parametrize(("N", "n", "G"), [(1, 1, 1), (1, 6, 4), (7, 16, 16), (256, 6, 6)])
def test_group_sums_are_einsums_numbers(N: int, n: int, G: int) -> None:
    """Group counters summed by a loop in workload order: einsum's numbers, bit for bit,
    compiled and not (thread shares with zeros, counters spanning twelve decades)."""
    from agent.sim.batch import group_sums

    rng = np.random.default_rng(N * n * G)
    frac = rng.random((N, n, G))
    frac[frac < 0.4] = 0.0
    counters = rng.standard_normal((N, n, 5)) * 10.0 ** rng.integers(-3, 12, (N, n, 5))
    want = np.einsum("nwg,nwk->ngk", frac, counters)
    plain = getattr(group_sums, "py_func", group_sums)
    for fn in (group_sums, plain):
        np.testing.assert_array_equal(fn(frac, counters), want)

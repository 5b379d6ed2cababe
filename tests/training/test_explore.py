"""The exploration controller: valid plans on every preset, coverage, dwell, determinism."""

from __future__ import annotations

import itertools

import pytest

from agent.sim import SimNode
from agent.sim.catalog import default_catalog
from agent.sim.scenario import Scenario, WorkloadInstance
from agent.validate import PlanContext, validate_plan
from models import catalogue
from models.controller import context
from models.explore import Explore

PRESETS = sorted(default_catalog().machines)


def _node(machine: str, n: int = 3) -> SimNode:
    workloads = [WorkloadInstance("kv", "memcached", threads=2)] + [
        WorkloadInstance(f"b{i}", "CG", threads=2) for i in range(n - 1)
    ]
    return SimNode(Scenario(f"explore-{machine}", machine, tuple(workloads)), seed=0)


@pytest.mark.parametrize("machine", PRESETS)
def test_every_plan_is_valid_and_applies(machine: str) -> None:
    node = _node(machine)
    ctl = Explore(seed=5, min_dwell=1, max_dwell=1)
    ctl.start(context(node))
    for _ in range(200):
        ctx = context(node)
        decision = ctl.decide(node.observe(), ctx)
        assert decision.plan is not None
        validate_plan(decision.plan, PlanContext(ctx.capabilities, ctx.allocation))
        node.apply(decision.plan)


def test_covers_ways_and_mba_levels_per_group() -> None:
    node = _node("gold6130", n=4)
    caps = node.capabilities()
    ctl = Explore(seed=0, min_dwell=1, max_dwell=1)
    ctx = context(node)
    ctl.start(ctx)
    seen: dict[str, set[tuple[int, int]]] = {g: set() for g in ctx.groups}
    overlapping = 0
    for _ in range(3000):
        plan = ctl.decide(node.observe(), ctx).plan
        masks = [plan.get(g, 0).l3_mask for g in ctx.groups]
        overlapping += any(a & b for i, a in enumerate(masks) for b in masks[i + 1 :])
        for g in ctx.groups:
            a = plan.get(g, 0)
            seen[g].add((a.ways, a.mb))
    ways = caps.l3.num_ways
    levels = caps.mba.levels()
    for g, pairs in seen.items():
        # Every way count and every MBA level is visited, and most of the grid.
        assert {w for w, _ in pairs} == set(range(1, ways + 1)), g
        assert {m for _, m in pairs} == set(levels), g
        assert len(pairs) >= 0.8 * ways * len(levels), (g, len(pairs))
    assert 0.1 < overlapping / 3000 < 0.3  # overlap=0.2 by default


def test_dwell_times_hold_allocations() -> None:
    node = _node("gold6130")
    ctl = Explore(seed=1, min_dwell=3, max_dwell=6)
    ctl.start(context(node))
    changes = [ctl.decide(node.observe(), context(node)).plan is not None for _ in range(300)]
    idx = [i for i, c in enumerate(changes) if c]
    gaps = [b - a for a, b in itertools.pairwise(idx)]
    assert min(gaps) >= 3 and max(gaps) <= 6
    assert set(gaps) == {3, 4, 5, 6}


def test_same_seed_same_sequence() -> None:
    def run(seed: int):
        node = _node("gold6130")
        ctl = Explore(seed=seed, min_dwell=1, max_dwell=2)
        ctl.start(context(node))
        return [ctl.decide(node.observe(), context(node)).plan for _ in range(30)]

    assert run(4) == run(4)
    assert run(4) != run(5)


def test_registered_and_options_checked() -> None:
    assert isinstance(catalogue.construct("explore[seed=2]"), Explore)
    with pytest.raises(ValueError, match="dwell"):
        Explore(min_dwell=5, max_dwell=2)
    with pytest.raises(ValueError, match="probability"):
        Explore(overlap=1.5)


def test_exclusive_groups_get_disjoint_masks() -> None:
    from agent.types import GroupSpec

    node = SimNode("default", seed=0, auto_groups=False)
    from agent.types import AllocationPlan, GroupAllocation

    node.create_group(GroupSpec("x", exclusive=True))
    node.apply(AllocationPlan.uniform({"x": GroupAllocation(l3_mask=0b11)}))
    node.create_group(GroupSpec("y"))
    ctl = Explore(seed=0, min_dwell=1, max_dwell=1, overlap=1.0)
    ctl.start(context(node))
    for _ in range(50):
        plan = ctl.decide(node.observe(), context(node)).plan
        assert plan.get("x", 0).l3_mask & plan.get("y", 0).l3_mask == 0
        node.apply(plan)


def test_more_groups_than_minimum_slices_share_ways() -> None:
    """3 groups, 4 ways, min_cbm_bits 2: no disjoint split exists, so masks overlap."""
    from agent.types import (
        Allocation,
        CacheCapabilities,
        GroupAllocation,
        GroupSpec,
        NodeCapabilities,
        Vendor,
    )
    from models.controller import ControlContext

    caps = NodeCapabilities(Vendor.SIMULATED, 4, l3=CacheCapabilities(0b1111, 2, 8))
    groups = {g: GroupSpec(g) for g in ("a", "b", "c")}
    held = Allocation({g: {0: GroupAllocation(l3_mask=0b1111)} for g in groups})
    ctx = ControlContext(caps, groups, held)
    ctl = Explore(seed=0, min_dwell=1, max_dwell=1, overlap=0.0)
    ctl.start(ctx)
    for _ in range(50):
        plan = ctl.decide(None, ctx).plan
        validate_plan(plan, PlanContext(caps, held))
        assert all(plan.get(g, 0).ways >= 2 for g in groups)

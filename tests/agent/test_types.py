"""Core types: construction rules and derived values."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from agent.errors import InvalidName
from agent.types import (
    SLO,
    Allocation,
    AllocationPlan,
    GroupAllocation,
    GroupKind,
    GroupSample,
    GroupSpec,
    LatencyStats,
    MbaCapabilities,
    MbaMode,
    Snapshot,
)


def test_lc_group_needs_an_slo() -> None:
    with pytest.raises(ValueError, match="needs an SLO"):
        GroupSpec("svc", GroupKind.LC)
    with pytest.raises(ValueError, match="only LC"):
        GroupSpec("job", GroupKind.BATCH, SLO(99.0, 1.0))


@pytest.mark.parametrize("name", ["../etc", "a/b", "", ".", "info", "x" * 65, "a\nb"])
def test_group_names_cannot_escape(name: str) -> None:
    with pytest.raises(InvalidName):
        GroupSpec(name)


@pytest.mark.parametrize(("p", "target"), [(98.0, 1.0), (99.0, 0.0), (99.0, float("inf"))])
def test_bad_slo(p: float, target: float) -> None:
    with pytest.raises(ValueError):
        SLO(p, target)


def test_latency_percentile_lookup() -> None:
    stats = LatencyStats(10, 1.0, 2.0, 3.0, 4.0)
    assert stats.percentile(99.9) == 4.0
    assert math.isnan(LatencyStats.empty().percentile(99))
    with pytest.raises(ValueError):
        stats.percentile(90)


def test_sample_derived_metrics() -> None:
    s = GroupSample(instructions=2e9, cycles=1e9, llc_references=1e6, llc_misses=2.5e5)
    assert s.ipc == 2.0 and s.mpki == 0.125 and s.miss_ratio == 0.25
    assert GroupSample().ipc is None


def test_snapshot_rates() -> None:
    snap = Snapshot(1.0, 0.5, {"a": GroupSample(instructions=1e9, memory_bytes=1e8)})
    assert snap.rate("a", "instructions") == 2e9
    assert snap.bandwidth_bps("a") == 2e8


@pytest.mark.parametrize(
    ("mba", "levels"),
    [
        (MbaCapabilities(10, 10, 100, 8), tuple(range(10, 101, 10))),
        (MbaCapabilities(15, 10, 100, 8), tuple(range(20, 101, 10))),
        (MbaCapabilities(0, 1, 4, 4, mode=MbaMode.AMD), (0, 1, 2, 3, 4)),
    ],
)
def test_mba_levels(mba: MbaCapabilities, levels: tuple[int, ...]) -> None:
    assert mba.levels() == levels


def test_core_types_pickle_and_stay_read_only() -> None:
    import pickle

    from agent.types import (
        AllocationPlan,
        CacheCapabilities,
        GroupAllocation,
        NodeCapabilities,
        Vendor,
    )

    caps = NodeCapabilities(
        Vendor.INTEL, 4, CacheCapabilities(0xFF, 1, 4), pmc_unsupported={"cycles": "ENOENT"}
    )
    plan = AllocationPlan.uniform({"a": GroupAllocation(0x3, 50)})
    snap = Snapshot(1.0, 0.5, {"a": GroupSample(instructions=1.0)})
    for value in (caps, plan, snap):
        assert pickle.loads(pickle.dumps(value)) == value
    with pytest.raises(TypeError):
        caps.pmc_unsupported["x"] = "y"  # type: ignore[index]


@pytest.mark.parametrize(
    ("change", "held"),
    [
        (GroupAllocation(), GroupAllocation(0x3, 50, 0xC)),
        (GroupAllocation(mb=20), GroupAllocation(0x3, 20, 0xC)),
        (GroupAllocation(l3_mask=0xF0), GroupAllocation(0xF0, 50, 0xC)),
        (GroupAllocation(l3_code_mask=0x1), GroupAllocation(0x3, 50, 0x1)),
    ],
)
def test_overlay_keeps_what_the_change_leaves_unset(change, held) -> None:
    assert GroupAllocation(0x3, 50, 0xC).overlay(change) == held


@pytest.mark.parametrize(
    ("held", "change", "result"),
    [
        (GroupAllocation(0x3, 50), GroupAllocation(0xF, 20), "change"),
        (GroupAllocation(0x3, 50), GroupAllocation(), "held"),
        (GroupAllocation(None, None, 0x1), GroupAllocation(0xF, 20, 0x2), "change"),
        (GroupAllocation(None, 50), GroupAllocation(0xF, 20), "change"),
        (GroupAllocation(0x3, 50), GroupAllocation(0xF), "new"),
    ],
)
def test_overlay_reuses_a_side_that_is_the_result(held, change, result: str) -> None:
    """Equal read-backs stay the same objects, so a node's change check is cheap."""
    got = held.overlay(change)
    assert got == GroupAllocation(
        change.l3_mask if change.l3_mask is not None else held.l3_mask,
        change.mb if change.mb is not None else held.mb,
        change.l3_code_mask if change.l3_code_mask is not None else held.l3_code_mask,
    )
    assert (got is change, got is held) == (result == "change", result == "held")


@pytest.mark.parametrize("cls", [Allocation, AllocationPlan])
def test_adopted_allocations_equal_constructed_ones(cls) -> None:
    groups = {"a": {0: GroupAllocation(0x3, 50), 1: GroupAllocation(0xC)}, "b": {0: None}}
    adopted = cls.adopt({g: dict(d) for g, d in groups.items()})
    assert adopted == cls(groups) and type(adopted) is cls
    with pytest.raises(TypeError):
        adopted.groups["a"][0] = GroupAllocation()  # type: ignore[index]


def test_counted_turns_non_finite_counts_into_none() -> None:
    from agent.sim import SimNode

    node = SimNode("default", seed=0)
    node.advance(0.1)
    snap = node.observe()
    assert snap.counted() is snap, "nothing to change: the same object"
    g = next(iter(snap.groups))
    bad = Snapshot(snap.timestamp, snap.interval_s, {**snap.groups, g: replace(
        snap.groups[g], instructions=math.nan, memory_bytes=math.inf)})  # fmt: skip
    fixed = bad.counted().groups[g]
    assert (fixed.instructions, fixed.memory_bytes) == (None, None)
    assert fixed.cycles == snap.groups[g].cycles and fixed.latency == snap.groups[g].latency

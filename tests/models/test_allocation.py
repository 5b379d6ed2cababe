"""Allocation helpers build plans the kernel accepts, for any group count and machine."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.types import (
    Allocation,
    CacheCapabilities,
    GroupSpec,
    MbaCapabilities,
    MbaMode,
    NodeCapabilities,
    Vendor,
    popcount,
)
from agent.validate import PlanContext, validate_plan
from models.allocation import (
    equal_masks,
    equal_ways,
    mb_fraction,
    mb_level,
    mb_scale,
    pack_ways,
    plan_from,
    usable_capabilities,
)

MACHINES = {
    "gold-6130": NodeCapabilities(
        Vendor.INTEL, 16, CacheCapabilities(0x7FF, 1, 16), MbaCapabilities(10, 10, 100, 8)
    ),
    "e5-v3-4clos": NodeCapabilities(Vendor.INTEL, 14, CacheCapabilities(0xFFFFF, 1, 4)),
    "min-2-bits": NodeCapabilities(
        Vendor.INTEL, 8, CacheCapabilities(0xFFF, 2, 16), MbaCapabilities(10, 10, 100, 8)
    ),
    "amd": NodeCapabilities(
        Vendor.AMD, 16, CacheCapabilities(0xFFFF, 0, 16), MbaCapabilities(0, 1, 2048, 16)
    ),
}


def valid(masks: dict[str, int], mbs: dict[str, int | None], caps: NodeCapabilities) -> None:
    names = list(masks)
    current = Allocation(
        {g: {d: plan_from({}, {}, caps).get(g, d) for d in caps.domains} for g in names}
    )
    validate_plan(plan_from(masks, mbs, caps), PlanContext(caps, current))


@settings(max_examples=60, deadline=None)
@given(machine=st.sampled_from(sorted(MACHINES)), n=st.integers(1, 24))
def test_equal_masks_are_always_valid(machine: str, n: int) -> None:
    caps = MACHINES[machine]
    groups = [f"g{i}" for i in range(n)]
    masks = equal_masks(groups, caps)
    valid(masks, {g: mb_level(caps, 1 / n) for g in groups}, caps)
    if sum(equal_ways(groups, caps).values()) <= caps.l3.num_ways:
        union = 0
        for m in masks.values():
            assert not union & m, "equal shares are disjoint when they fit"
            union |= m


def test_pack_ways_is_contiguous_from_the_bottom() -> None:
    caps = MACHINES["gold-6130"]
    assert pack_ways({"lc": 2, "b": 3}, caps) == {"lc": 0b11, "b": 0b11100}
    with pytest.raises(ValueError, match="do not fit"):
        pack_ways({"a": 6, "b": 6}, caps)
    with pytest.raises(ValueError, match="minimum"):
        pack_ways({"a": 1}, MACHINES["min-2-bits"])


def test_equal_ways_sum_to_the_cache() -> None:
    caps = MACHINES["gold-6130"]
    ways = equal_ways(["a", "b", "c"], caps)
    assert (
        sorted(ways.values()) == [3, 4, 4]
        and sum(map(popcount, pack_ways(ways, caps).values())) == 11
    )


@pytest.mark.parametrize(("fraction", "level"), [(1.0, 100), (0.25, 20), (0.05, 10), (0.5, 50)])
def test_mb_level_rounds_down_to_a_level(fraction: float, level: int) -> None:
    assert mb_level(MACHINES["gold-6130"], fraction) == level


def test_mb_level_without_mba() -> None:
    assert mb_level(MACHINES["e5-v3-4clos"], 0.5) is None


AMD_150 = replace(
    MACHINES["amd"],
    mba=MbaCapabilities(0, 1, 2048, 16, mode=MbaMode.AMD),
    memory_bandwidth_bps=150e9,
)

MBPS_20G = replace(
    MACHINES["gold-6130"],
    mba=MbaCapabilities(1, 1, 4294967295, 8, mode=MbaMode.MBPS),
    memory_bandwidth_bps=20e9,
)


@pytest.mark.parametrize(
    ("caps", "fraction", "level"),
    [
        # a peak of 150 GB/s is 1,200 units of 1/8 GB/s: half of it is 600 units (75 GB/s),
        # where half of 2048 (128 GB/s) would throttle nothing a 150 GB/s node draws
        (AMD_150, 0.5, 600),
        (AMD_150, 0.25, 300),
        (AMD_150, 1.0, 2048),  # the whole of it: unlimited
        (replace(AMD_150, memory_bandwidth_bps=None), 0.5, 1024),  # no peak: of 2048
        (replace(AMD_150, memory_bandwidth_bps=400e9), 0.5, 1024),  # peak above the range
        (replace(AMD_150, memory_bandwidth_bps=float("nan")), 0.5, 1024),  # no usable peak
        (MBPS_20G, 0.5, int(10e9 / 2**20)),
        (replace(MBPS_20G, memory_bandwidth_bps=float("inf")), 0.5, 4294967295),
    ],
)
def test_amd_mb_levels_are_fractions_of_the_peak(caps, fraction: float, level: int) -> None:
    assert mb_level(caps, fraction) == level


@pytest.mark.parametrize(
    ("caps", "scale", "mb", "share"),
    [
        (MACHINES["gold-6130"], 100.0, 50, 0.5),
        (AMD_150, 1200.0, 600, 0.5),
        (AMD_150, 1200.0, 2048, 1.0),  # unlimited: all of the peak, no more
        (replace(AMD_150, memory_bandwidth_bps=None), 2048.0, 1024, 0.5),
        # a peak that is no usable number counts as unknown
        (replace(AMD_150, memory_bandwidth_bps=float("nan")), 2048.0, 1024, 0.5),
        (replace(AMD_150, memory_bandwidth_bps=-1e9), 2048.0, 1024, 0.5),
        (replace(AMD_150, memory_bandwidth_bps=float("inf")), 2048.0, 1024, 0.5),
        (MBPS_20G, 20e9 / 2**20, 20e9 / 2**21, 0.5),  # mba_MBps: MiB/s of the peak
    ],
)
def test_mb_scale_and_fraction(caps, scale: float, mb: float, share: float) -> None:
    assert mb_scale(caps) == pytest.approx(scale) and mb_fraction(caps, mb) == pytest.approx(share)
    assert mb_fraction(caps, mb_level(caps, share)) == pytest.approx(share, abs=0.01)


def _l3(cbm: int, least: int = 1, sparse: bool = False) -> NodeCapabilities:
    l3 = CacheCapabilities(cbm, least, 16, (0, 1), sparse_masks=sparse, size_bytes=12 << 20)
    return NodeCapabilities(Vendor.INTEL, 8, l3)


@pytest.mark.parametrize(
    ("caps", "reserved", "cbm"),
    [
        (_l3(0xFFF), {}, 0xFFF),
        (_l3(0xFFF), {0: 0, 1: 0}, 0xFFF),
        (_l3(0xFFF), {0: 0xC00}, 0x3FF),  # one domain's reserved ways count for all
        (_l3(0xFFF), {0: 0x030, 1: 0x800}, 0x7C0),  # runs 0-3 and 6-10: the wider
        (_l3(0xFFF, sparse=True), {0: 0x030}, 0xFCF),  # sparse: every way left
        (_l3(0xFFF, least=2), {0: 0xFFE}, 0xFFF),  # too few left: unchanged (guard's turn)
    ],
)
def test_usable_capabilities_leave_out_the_reserved_ways(caps, reserved, cbm) -> None:
    usable = usable_capabilities(caps, reserved)
    assert usable.l3.cbm_mask == cbm
    assert usable.l3.way_bytes == caps.l3.way_bytes, "a way is as large as before"


def test_eq_splits_the_ways_no_other_tool_holds() -> None:
    from models.basic import EqualPartition
    from models.controller import ControlContext

    groups = {g: GroupSpec(g) for g in ("a", "b")}
    ctx = ControlContext(_l3(0xFFF), groups, Allocation({}), reserved_ways={0: 0xF00, 1: 0xF00})
    plan = EqualPartition().start(ctx).plan
    assert {plan.get(g, d).l3_mask for g in groups for d in (0, 1)} == {0x00F, 0x0F0}

"""The safety guard: plan screening (validation, way/MB steps, dwell) and the SLO state machine."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.types import (
    SLO,
    Allocation,
    AllocationPlan,
    CacheCapabilities,
    GroupAllocation,
    GroupKind,
    GroupSample,
    GroupSpec,
    LatencyStats,
    MbaCapabilities,
    MbaMode,
    NodeCapabilities,
    Snapshot,
    Vendor,
    is_contiguous,
    popcount,
)
from agent.validate import PlanContext, validate_plan
from tuner.config import GuardConfig
from tuner.guard import (
    PlanGuard,
    SloGuard,
    slo_verdicts,
    step_contiguous,
    step_mb,
    step_sparse,
    trim_reserved,
)

WAYS = 12


def caps(sparse: bool = False, min_bits: int = 1) -> NodeCapabilities:
    return NodeCapabilities(
        vendor=Vendor.INTEL,
        num_cpus=8,
        l3=CacheCapabilities(
            cbm_mask=(1 << WAYS) - 1, min_cbm_bits=min_bits, num_closids=8, sparse_masks=sparse
        ),
        mba=MbaCapabilities(min_bandwidth=10, bandwidth_gran=10, max_bandwidth=100, num_closids=8),
    )


def run_mask(data, least: int) -> int:
    size = data.draw(st.integers(least, WAYS))
    start = data.draw(st.integers(0, WAYS - size))
    return ((1 << size) - 1) << start


@given(st.data(), st.integers(1, 4), st.integers(1, 3))
def test_contiguous_steps_stay_valid_bounded_and_arrive(data, budget: int, least: int) -> None:
    old, target = run_mask(data, least), run_mask(data, least)
    a, b = (old & -old).bit_length() - 1, old.bit_length()
    c, d = (target & -target).bit_length() - 1, target.bit_length()
    distance = abs(a - c) + abs(b - d)
    cur, steps = old, 0
    while cur != target:
        new = step_contiguous(cur, target, budget, least)
        assert is_contiguous(new) and popcount(new) >= least
        assert popcount(new ^ cur) <= budget
        assert new & ~((1 << WAYS) - 1) == 0
        cur, steps = new, steps + 1
        assert steps <= distance, "every step must get closer"
    assert steps == math.ceil(distance / budget)


@given(st.integers(1, (1 << WAYS) - 1), st.integers(1, (1 << WAYS) - 1), st.integers(1, 4))
def test_sparse_steps_stay_valid_bounded_and_arrive(old: int, target: int, budget: int) -> None:
    least = 1
    cur = old
    for _ in range(2 * WAYS):
        if cur == target:
            break
        new = step_sparse(cur, target, budget, least)
        assert popcount(new) >= least and popcount(new ^ cur) <= budget
        cur = new
    assert cur == target


@pytest.mark.parametrize(
    ("old", "target", "steps", "want"),
    [(100, 10, 2, 80), (10, 100, 1, 20), (50, 60, 2, 60), (100, 100, 1, 100)],
)
def test_mb_steps(old: int, target: int, steps: int, want: int) -> None:
    assert step_mb(old, target, steps, 10) == want


GROUPS = {"a": GroupSpec("a"), "b": GroupSpec("b")}


def alloc(**masks: tuple[int, int]) -> Allocation:
    return Allocation({g: {0: GroupAllocation(l3_mask=m, mb=mb)} for g, (m, mb) in masks.items()})


def plan(**masks: tuple[int | None, int | None]) -> AllocationPlan:
    return AllocationPlan(
        {g: {0: GroupAllocation(l3_mask=m, mb=mb)} for g, (m, mb) in masks.items()}
    )


@pytest.mark.parametrize(
    ("bad", "rule"),
    [
        (plan(a=(0b101, None)), "contiguous"),
        (plan(a=(1 << WAYS, None)), "mask_range"),
        (plan(a=(None, 5)), "mb_range"),
        (plan(zz=(0b1, None)), "unknown_group"),
    ],
)
def test_invalid_plans_are_dropped_with_the_rule(bad: AllocationPlan, rule: str) -> None:
    current = alloc(a=(0xFFF, 100), b=(0xFFF, 100))
    screened = PlanGuard(GuardConfig()).screen(bad, caps(), GROUPS, current, 0.0)
    assert screened.plan is None and screened.dropped == rule and screened.error


@pytest.mark.parametrize(
    ("mask", "reserved", "least", "sparse", "want"),
    [
        (0xFFF, 0x000, 1, False, 0xFFF),  # nothing reserved
        (0xFFF, 0xC00, 1, False, 0x3FF),  # the top ways go
        (0xFFF, 0x030, 1, False, 0xFC0),  # a hole: the widest run is kept
        (0x0FF, 0x030, 1, False, 0x00F),  # runs of 4 and 2: the wider
        (0x03C, 0x018, 1, False, 0x004),  # runs of 1 and 1: the lowest
        (0x03C, 0x018, 2, False, None),  # ... below min_cbm_bits: nothing
        (0xFFF, 0x030, 1, True, 0xFCF),  # sparse masks keep every way left
        (0x0F0, 0x0F0, 1, True, None),  # every way reserved
        (0x00F, 0x0F0, 2, False, 0x00F),  # no overlap: unchanged
    ],
)
def test_reserved_ways_are_trimmed_from_a_mask(mask, reserved, least, sparse, want) -> None:
    assert trim_reserved(mask, reserved, least, sparse) == want


@pytest.mark.parametrize("sparse", [False, True])
def test_the_guard_trims_reserved_ways_and_a_group_left_none_keeps_its_mask(caplog, sparse) -> None:
    """Another tool holds ways 4-5 exclusively: every plan is trimmed before it reaches the
    node; a mask with nothing left keeps what the group holds, said and counted once."""
    guard = PlanGuard(GuardConfig())
    guard.reserved = {0: 0x030}
    current = alloc(a=(0x00F, 100), b=(0xFC0, 100))
    screened = guard.screen(plan(a=(0x0FF, None), b=(0xF00, 50)), caps(sparse), GROUPS, current, 0)
    assert screened.dropped is None and screened.limits == ()
    # a keeps ways 0-3 and, with sparse masks, 6-7 too; 0-3 alone is what it holds
    want = plan(a=(0x0CF, None), b=(0xF00, 50)) if sparse else plan(b=(0xF00, 50))
    assert screened.plan == want
    for _ in range(3):  # b's mask lies wholly in the reserved ways: b keeps 0xFC0
        starved = guard.screen(plan(a=(0x00F, 60), b=(0x030, 50)), caps(sparse), GROUPS, current, 0)
        assert starved.plan == plan(a=(0x00F, 60), b=(None, 50))
    assert starved.limits == ()
    said = [r for r in caplog.records if getattr(r, "event", None) == "reserved"]
    assert len(said) == 1 and "'b'" in said[0].getMessage()
    guard.screen(plan(b=(0xF00, None)), caps(sparse), GROUPS, current, 0)  # ways again
    again = guard.screen(plan(b=(0x030, None)), caps(sparse), GROUPS, current, 0)
    assert again.limits == ("reserved",), "a new episode is counted again"


def test_no_op_entries_are_removed_and_mb_normalised() -> None:
    current = alloc(a=(0xFFF, 100), b=(0xFFF, 100))
    screened = PlanGuard(GuardConfig()).screen(
        plan(a=(0xFFF, 100), b=(0x0F0, 15)), caps(), GROUPS, current, 0.0
    )
    assert screened.plan == plan(b=(0x0F0, 20))  # MB rounded up as the kernel does
    same = PlanGuard(GuardConfig()).screen(plan(a=(0xFFF, 100)), caps(), GROUPS, current, 0.0)
    assert same.plan is None and same.dropped is None


def test_change_limits_clamp_toward_the_target() -> None:
    guard = PlanGuard(GuardConfig(max_way_step=2, max_mb_step=1))
    current = alloc(a=(0xFFF, 100), b=(0xFFF, 100))
    s = guard.screen(plan(a=(0x00F, 10), b=(0xF00, 100)), caps(), GROUPS, current, 0.0)
    assert set(s.limits) == {"ways", "mb"}
    a, b = s.plan["a"][0], s.plan["b"][0]
    assert popcount(a.l3_mask ^ 0xFFF) == 2 and is_contiguous(a.l3_mask) and a.mb == 90
    assert popcount(b.l3_mask ^ 0xFFF) == 2 and b.l3_mask & 0xF00 == 0xF00
    # Unlimited when the fallback is in charge (limit=False).
    s = guard.screen(plan(a=(0x00F, 10)), caps(), GROUPS, current, 0.0, limit=False)
    assert s.plan == plan(a=(0x00F, 10)) and not s.limits


def test_dwell_holds_a_group_that_just_changed() -> None:
    guard = PlanGuard(GuardConfig(min_dwell_s=1.0))
    current = alloc(a=(0xFFF, 100), b=(0xFFF, 100))
    first = guard.screen(plan(a=(0x00F, None)), caps(), GROUPS, current, 10.0)
    guard.committed(first.plan, current, 10.0)
    now = alloc(a=(0x00F, 100), b=(0xFFF, 100))
    held = guard.screen(plan(a=(0x0FF, None), b=(0xF00, None)), caps(), GROUPS, now, 10.5)
    assert held.plan == plan(b=(0xF00, None)) and held.limits == ("dwell",)
    later = guard.screen(plan(a=(0x0FF, None)), caps(), GROUPS, now, 11.0)
    assert later.plan == plan(a=(0x0FF, None)) and not later.limits
    guard.forget()
    assert not guard.last_change


def _apply(current: Allocation, screened_plan: AllocationPlan | None) -> Allocation:
    """``current`` with ``screened_plan``'s values laid over it (what the node would hold)."""
    if screened_plan is None:
        return current
    groups = {g: dict(p) for g, p in current.groups.items()}
    for g, per_domain in screened_plan.groups.items():
        for d, a in per_domain.items():
            groups[g][d] = groups[g][d].overlay(a)
    return Allocation(groups)


EXCLUSIVE_CASES = {
    # A rotation: web (exclusive) must cross b1 to reach the top; only web's and b1's masks
    # hold while b2 moves, then the target is applied whole once nothing else can move.
    "held_in_conflict_only": (
        {"web": True, "b1": False, "b2": False},
        dict(web=(0x00F, 100), b1=(0x0F0, 100), b2=(0xF00, 100)),
        dict(web=(0xF00, None), b1=(0x00F, None), b2=(0x0F0, None)),
        2,
        ("b2",),
    ),
    # A swap whose every step overlaps: held for good, so applied whole at once.
    "swap_applied_whole": (
        {"a": True, "b": False},
        dict(a=(0b1100, 100), b=(0b0011, 100)),
        dict(a=(0b0011, 50), b=(0b1100, 100)),
        1,
        ("a", "b"),
    ),
    # A new exclusive group starts overlapping every way: no step can separate them.
    "node_already_overlaps": (
        {"x": True, "a": False},
        dict(x=(0xFFF, 100), a=(0xFFF, 100)),
        dict(x=(0xF00, None), a=(0x0FF, None)),
        1,
        ("x", "a"),
    ),
}


@pytest.mark.parametrize(
    ("exclusive", "start", "want", "step", "first_moved"),
    EXCLUSIVE_CASES.values(),
    ids=EXCLUSIVE_CASES.keys(),
)
def test_exclusive_conflicts_hold_only_their_masks_and_never_raise_or_stall(
    exclusive, start, want, step, first_moved
) -> None:
    groups = {g: GroupSpec(g, exclusive=x) for g, x in exclusive.items()}
    names = frozenset(g for g, x in exclusive.items() if x)
    guard = PlanGuard(GuardConfig(max_way_step=step))
    current, target = alloc(**start), plan(**want)
    first = guard.screen(target, caps(), groups, current, 0.0)
    moved = {g for g, p in first.plan.groups.items() if p[0].l3_mask is not None}
    assert sorted(moved) == sorted(first_moved)
    for i in range(20):
        screened = PlanGuard(GuardConfig(max_way_step=step)).screen(
            target, caps(), groups, current, float(i)
        )
        assert screened.dropped is None
        current = _apply(current, screened.plan)
        validate_plan(current.as_plan(), PlanContext(caps(), current, names))
    assert all(current[g][0].l3_mask == m for g, (m, _) in want.items())


def lc_snapshot(p95: float | None) -> Snapshot:
    lat = LatencyStats.empty() if p95 is None else LatencyStats(100, p95 / 2, p95, p95, p95)
    return Snapshot(1.0, 0.1, {"web": GroupSample(latency=lat), "b": GroupSample()})


LC_GROUPS = {"web": GroupSpec("web", GroupKind.LC, SLO(95.0, 1.0)), "b": GroupSpec("b")}


def test_slo_verdicts() -> None:
    assert slo_verdicts(lc_snapshot(2.0), LC_GROUPS) == {"web": True}
    assert slo_verdicts(lc_snapshot(0.5), LC_GROUPS) == {"web": False}
    assert slo_verdicts(lc_snapshot(None), LC_GROUPS) == {"web": None}


def test_slo_guard_trips_after_k_in_a_row_and_recovers_after_a_stable_period() -> None:
    g = SloGuard(violation_intervals=3, stable_intervals=2)
    seq = [True, True, False, True, True, None, True]  # None (no requests) does not reset
    switches = [g.update({"web": v}) for v in seq]
    assert [s is not None for s in switches] == [False] * 6 + [True]
    assert switches[-1].to_fallback and switches[-1].groups == ("web",) and g.in_fallback
    assert g.update({"web": False}) is None
    assert g.update({"web": True}) is None, "a violation restarts the stable period"
    assert g.update({"web": False}) is None
    assert g.update({"web": None}) is None, "an unjudged interval is not a clean one"
    back = g.update({"web": False})
    assert back is not None and not back.to_fallback and not g.in_fallback
    assert g.update({"web": True}) is None and g.update({"web": True}) is None
    assert g.update({"web": True}).to_fallback, "trips again after K fresh violations"


def _trip_and_recover(guard: SloGuard, clean_in_primary: int) -> int:
    """K violations (a trip), clean intervals until it switches back, then
    ``clean_in_primary`` more; returns how many clean intervals switching back took."""
    for _ in range(guard.violation_intervals):
        guard.update({"web": True})
    assert guard.in_fallback
    took = 0
    while guard.in_fallback:
        took += 1
        guard.update({"web": False})
    for _ in range(clean_in_primary):
        assert guard.update({"web": False}) is None
    return took


@pytest.mark.parametrize(
    ("clean_in_primary", "window", "cap", "took"),
    [
        (0, 5, 100, [4, 8, 16, 32, 64, 100, 100]),  # flapping: doubles, capped
        (2, 5, 100, [4, 8, 16, 32, 64, 100, 100]),  # tripped 5 intervals after: in the window
        (3, 5, 100, [4, 4, 4, 4, 4, 4, 4]),  # 6 after, a quiet period: starts over
        (0, 5, 2, [4, 4, 4, 4, 4, 4, 4]),  # a cap below stable_intervals: never below it
    ],
)
def test_slo_guard_backs_off_a_primary_that_trips_soon_after_switching_back(
    clean_in_primary: int, window: int, cap: int, took: list[int]
) -> None:
    g = SloGuard(3, 4, backoff_window=window, max_stable=cap)
    assert [_trip_and_recover(g, clean_in_primary) for _ in took] == took


@pytest.mark.parametrize(
    ("interval", "counts"),
    [
        ({"web": None}, False),  # the latency feed stopped: nothing to judge
        ({"web": None, "api": None}, False),
        ({"web": None, "api": False}, True),  # one LC group judged, none violated
        ({"web": False}, True),
    ],
)
def test_only_judged_intervals_count_toward_switching_back(interval, counts: bool) -> None:
    g = SloGuard(violation_intervals=1, stable_intervals=3)
    assert g.update({"web": True}).to_fallback
    switches = [g.update(interval) for _ in range(50)]
    assert any(switches) is counts
    assert g.unjudged["web"] == (50 if interval["web"] is None else 0)


MBPS_MAX = 4294967295  # the kernel's mba_MBps default: every new group starts there


def mb_caps(mode: MbaMode, maximum: int, peak_bps: float) -> NodeCapabilities:
    return NodeCapabilities(
        vendor=Vendor.AMD if mode is MbaMode.AMD else Vendor.INTEL,
        num_cpus=8,
        l3=CacheCapabilities(cbm_mask=(1 << WAYS) - 1, min_cbm_bits=1, num_closids=8),
        mba=MbaCapabilities(
            min_bandwidth=1, bandwidth_gran=1, max_bandwidth=maximum, num_closids=8, mode=mode
        ),
        memory_bandwidth_bps=peak_bps,
    )


@pytest.mark.parametrize(
    ("mode", "maximum", "peak_bps", "start", "target", "path"),
    [
        # mba_MBps, 100 GiB/s (peak 102400 MiB/s, a step 1024): down from the peak at once
        (MbaMode.MBPS, MBPS_MAX, 100 * 2**30, MBPS_MAX, 98304, [100352, 98304]),
        # AMD at "unlimited" 2048, peak 150 GB/s = 1200 units (a step 12)
        (MbaMode.AMD, 2048, 150e9, 2048, 1152, [1176, 1152]),
        # back up: straight to "unlimited" once past the peak
        (MbaMode.AMD, 2048, 150e9, 1176, 2048, [2048]),
        (MbaMode.AMD, 2048, 150e9, 1152, 2048, [1176, 2048]),
    ],
)
def test_mb_steps_start_and_end_at_the_peak(mode, maximum, peak_bps, start, target, path) -> None:
    node = mb_caps(mode, maximum, peak_bps)
    guard = PlanGuard(GuardConfig(max_mb_step=2))
    groups = {"a": GroupSpec("a")}
    seen = []
    for i in range(len(path)):
        current = Allocation({"a": {0: GroupAllocation(l3_mask=0xFFF, mb=start)}})
        screened = guard.screen(plan(a=(None, target)), node, groups, current, float(i))
        start = screened.plan["a"][0].mb
        seen.append(start)
    assert seen == path


def amd_caps() -> NodeCapabilities:
    """EPYC-like: 20 ways, masks may be empty and sparse, MB 0..2048 (0 allowed)."""
    l3 = CacheCapabilities(cbm_mask=0xFFFFF, min_cbm_bits=0, num_closids=8, sparse_masks=True)
    return dataclasses.replace(mb_caps(MbaMode.AMD, 2048, 150e9), l3=l3)


@pytest.mark.parametrize(
    ("have", "want", "got"),
    [
        ((0, 0), (0xFFFFF, 1200), (0b11, 24)),  # from nothing: two ways, two MB steps
        ((0, 0), (0xF0000, None), (0x30000, None)),  # grows from the target's low end
        ((0b1, 12), (0xFFFFF, 1200), (0b111, 36)),  # as from one way and one step
    ],
)
def test_zero_ways_and_mb_zero_are_limited_like_any_value(have, want, got) -> None:
    current = Allocation({"b": {0: GroupAllocation(l3_mask=have[0], mb=have[1])}})
    guard = PlanGuard(GuardConfig(max_way_step=2, max_mb_step=2))
    screened = guard.screen(plan(b=want), amd_caps(), {"b": GroupSpec("b")}, current, 0.0)
    assert screened.plan == plan(b=got) and "ways" in screened.limits


def test_mb_step_size_per_mode() -> None:
    from dataclasses import replace

    from agent.types import MbaMode
    from tuner.guard import mb_step_size

    assert mb_step_size(caps()) == 10
    mbps = replace(caps().mba, mode=MbaMode.MBPS, bandwidth_gran=1, max_bandwidth=4294967295)
    assert mb_step_size(replace(caps(), mba=mbps)) is None, "peak unknown: no MB limit"
    known = replace(caps(), mba=mbps, memory_bandwidth_bps=100 * 2**30)
    assert mb_step_size(known) == 1024  # 1% of 100 GiB/s in MiB/s
    assert mb_step_size(replace(caps(), mba=None)) is None
    # AMD: 1% of the full bandwidth, not one unit of 1/8 GB/s (2 steps from 2048 to half of
    # a 150 GB/s peak would otherwise take ~700 intervals)
    amd = replace(caps().mba, mode=MbaMode.AMD, min_bandwidth=0, bandwidth_gran=1)
    amd = replace(amd, max_bandwidth=2048)
    assert mb_step_size(replace(caps(), mba=amd, memory_bandwidth_bps=150e9)) == 12
    assert mb_step_size(replace(caps(), mba=amd, memory_bandwidth_bps=None)) == 20

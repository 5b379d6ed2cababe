"""The shared plan validator: each kernel rule, with the kernel's own examples."""

from __future__ import annotations

import dataclasses

import pytest

from agent.errors import GroupNotFound, InvalidAllocation
from agent.types import (
    Allocation,
    AllocationPlan,
    CacheCapabilities,
    GroupAllocation,
    MbaCapabilities,
    MbaMode,
    NodeCapabilities,
    Vendor,
    contiguous_mask,
    is_contiguous,
)
from agent.validate import PlanContext, validate_plan

L3 = CacheCapabilities(cbm_mask=0xFFFFF, min_cbm_bits=2, num_closids=16, domains=(0, 1))
MBA = MbaCapabilities(
    min_bandwidth=10, bandwidth_gran=10, max_bandwidth=100, num_closids=8, domains=(0, 1)
)
CAPS = NodeCapabilities(vendor=Vendor.INTEL, num_cpus=16, l3=L3, mba=MBA)
FULL = GroupAllocation(l3_mask=0xFFFFF, mb=100)
CURRENT = Allocation({g: {0: FULL, 1: FULL} for g in ("a", "b")})


def ctx(**kw) -> PlanContext:
    return PlanContext(caps=kw.pop("caps", CAPS), current=kw.pop("current", CURRENT), **kw)


def plan_for(alloc: GroupAllocation, group: str = "a", domain: int = 0) -> AllocationPlan:
    return AllocationPlan({group: {domain: alloc}})


@pytest.mark.parametrize(
    ("mask", "expected"),
    [(0b1, True), (0b110, True), (0b101, False), (0xF0, True), (0xF7, False), (0, False)],
)
def test_is_contiguous(mask: int, expected: bool) -> None:
    assert is_contiguous(mask) is expected


def test_contiguous_mask() -> None:
    assert contiguous_mask(2) == 0x3
    assert contiguous_mask(3, 2) == 0b11100


@pytest.mark.parametrize(
    ("alloc", "rule"),
    [
        (GroupAllocation(l3_mask=0xF7), "contiguous"),
        (GroupAllocation(l3_mask=0x100000), "mask_range"),
        (GroupAllocation(l3_mask=0), "mask_range"),
        (GroupAllocation(l3_mask=0x1), "min_cbm_bits"),
        (GroupAllocation(mb=5), "mb_range"),
        (GroupAllocation(mb=101), "mb_range"),
        (GroupAllocation(l3_code_mask=0x3), "cdp_off"),
        (GroupAllocation(l3_mask="ff"), "mask_type"),  # type: ignore[arg-type]
    ],
)
def test_each_rule_rejects(alloc: GroupAllocation, rule: str) -> None:
    with pytest.raises(InvalidAllocation) as err:
        validate_plan(plan_for(alloc), ctx())
    assert err.value.rule == rule
    assert "'a'" in str(err.value) and "domain 0" in str(err.value)


def test_unknown_domain() -> None:
    with pytest.raises(InvalidAllocation) as err:
        validate_plan(plan_for(GroupAllocation(l3_mask=0x3), domain=7), ctx())
    assert err.value.rule == "unknown_domain"


def test_unknown_group() -> None:
    with pytest.raises(GroupNotFound):
        validate_plan(plan_for(GroupAllocation(l3_mask=0x3), group="ghost"), ctx())


@pytest.mark.parametrize(("ask", "held"), [(15, 20), (10, 10), (91, 100), (100, 100)])
def test_mb_rounds_up_to_granularity(ask: int, held: int) -> None:
    out = validate_plan(plan_for(GroupAllocation(mb=ask)), ctx())
    assert out.get("a", 0).mb == held


def test_sparse_masks_allowed_when_the_cpu_says_so() -> None:
    sparse = NodeCapabilities(
        vendor=Vendor.INTEL,
        num_cpus=4,
        l3=CacheCapabilities(0xFFFFF, 1, 16, (0, 1), sparse_masks=True),
    )
    validate_plan(plan_for(GroupAllocation(l3_mask=0xF7)), ctx(caps=sparse))


def test_mbps_mode_takes_any_positive_rate() -> None:
    mbps = MbaCapabilities(0, 1, 4294967295, 8, mode=MbaMode.MBPS, domains=(0, 1))
    caps = NodeCapabilities(vendor=Vendor.INTEL, num_cpus=4, l3=L3, mba=mbps)
    assert (
        validate_plan(plan_for(GroupAllocation(mb=12345)), ctx(caps=caps)).get("a", 0).mb == 12345
    )
    with pytest.raises(InvalidAllocation):
        validate_plan(plan_for(GroupAllocation(mb=0)), ctx(caps=caps))


def test_no_mba_on_node() -> None:
    caps = NodeCapabilities(vendor=Vendor.INTEL, num_cpus=4, l3=L3)
    with pytest.raises(InvalidAllocation) as err:
        validate_plan(plan_for(GroupAllocation(mb=50)), ctx(caps=caps))
    assert err.value.rule == "unsupported_resource"


def test_overlap_with_exclusive_group() -> None:
    current = Allocation({"a": {0: FULL}, "x": {0: GroupAllocation(0x3, 100)}})
    # "x" is exclusive on ways 0-1; "a" asking for ways 1-4 overlaps it.
    with pytest.raises(InvalidAllocation) as err:
        validate_plan(
            plan_for(GroupAllocation(l3_mask=0x1E)),
            ctx(current=current, exclusive=frozenset({"x"})),
        )
    assert err.value.rule == "exclusive_overlap"
    validate_plan(
        plan_for(GroupAllocation(l3_mask=0x3C)), ctx(current=current, exclusive=frozenset({"x"}))
    )


def test_exclusive_group_may_not_overlap_foreign_groups() -> None:
    current = Allocation({"x": {0: GroupAllocation(0x3, 100)}})
    with pytest.raises(InvalidAllocation):
        validate_plan(
            plan_for(GroupAllocation(l3_mask=0xC), group="x"),
            ctx(current=current, exclusive=frozenset({"x"}), others={"": {0: 0xFFFFC}}),
        )


def test_exclusive_group_may_not_hold_the_ways_hardware_uses() -> None:
    """The kernel counts shareable_bits (ways I/O devices use) as another group's: an
    exclusive group's write into them is refused ("Overlaps with other group")."""
    caps = dataclasses.replace(CAPS, l3=dataclasses.replace(L3, shareable_bits=0xC0000))
    current = Allocation({"x": {0: GroupAllocation(0x3, 100)}})
    exclusive = frozenset({"x"})
    with pytest.raises(InvalidAllocation, match="shareable_bits 0xc0000") as err:
        validate_plan(
            plan_for(GroupAllocation(l3_mask=0xF0000), group="x"),
            ctx(caps=caps, current=current, exclusive=exclusive),
        )
    assert err.value.rule == "exclusive_overlap"
    validate_plan(  # a shareable group may use them, an exclusive one the other ways
        plan_for(GroupAllocation(l3_mask=0xF0000)), ctx(caps=caps, exclusive=exclusive)
    )
    validate_plan(
        plan_for(GroupAllocation(l3_mask=0x3F000), group="x"),
        ctx(caps=caps, current=current, exclusive=exclusive),
    )


@pytest.mark.parametrize(
    ("valid", "lookalike", "rule"),
    [
        (GroupAllocation(l3_mask=0x3), GroupAllocation(l3_mask=3.0), "mask_type"),  # type: ignore[arg-type]
        (GroupAllocation(mb=10), GroupAllocation(mb=10.0), "mb_type"),  # type: ignore[arg-type]
    ],
)
def test_remembered_entries_do_not_admit_equal_values_of_another_type(
    valid: GroupAllocation, lookalike: GroupAllocation, rule: str
) -> None:
    """A node's memo of valid entries is keyed by value, and 3.0 == 3, True == 1: the
    lookalike must still be refused: an MB value or a mask is an integer."""
    memo: dict = {}
    for _ in range(2):  # the second time from the memo
        assert validate_plan(plan_for(valid), ctx(valid=memo)).get("a", 0) == valid
    with pytest.raises(InvalidAllocation) as err:
        validate_plan(plan_for(lookalike), ctx(valid=memo))
    assert err.value.rule == rule


@pytest.mark.parametrize(
    "alloc",
    [
        GroupAllocation(l3_mask=0x3, mb=15),
        GroupAllocation(l3_mask=0xF7),
        GroupAllocation(mb=101),
        GroupAllocation(l3_code_mask=0x3),
    ],
)
def test_remembered_entries_give_the_same_answers(alloc: GroupAllocation) -> None:
    memo: dict = {}

    def answer(context: PlanContext):
        try:
            return validate_plan(plan_for(alloc), context)
        except InvalidAllocation as exc:
            return exc.rule

    fresh = answer(ctx())
    assert answer(ctx(valid=memo)) == fresh
    assert answer(ctx(valid=memo)) == fresh  # from the memo when it was valid
    assert len(memo) == (0 if isinstance(fresh, str) else 1)


def test_the_memo_of_valid_entries_is_bounded(monkeypatch) -> None:
    import agent.validate as V

    monkeypatch.setattr(V, "VALID_MEMO_MAX", 3)
    memo: dict = {}
    for ways in range(2, 10):
        plan = plan_for(GroupAllocation(l3_mask=(1 << ways) - 1))
        assert validate_plan(plan, ctx(valid=memo)) == plan
    assert len(memo) == 3


def test_plans_and_allocations_are_immutable() -> None:
    plan = plan_for(GroupAllocation(l3_mask=0x3))
    with pytest.raises(TypeError):
        plan.groups["b"] = {}  # type: ignore[index]
    assert hash(GroupAllocation(0x3, 10)) == hash(GroupAllocation(0x3, 10))


@pytest.mark.parametrize(
    ("pids", "cpus", "error"),
    [
        ([99], [], "no task with pid 99"),
        (["1"], [], "not an integer"),
        ([True], [], "integer"),
        ([1], [16], "out of range 0..15"),
        ([1], [1.5], "not an integer"),
    ],
)
def test_assign_ids_are_checked_before_anything_moves(pids, cpus, error: str) -> None:
    from agent.errors import InvalidCpus, UnknownTask
    from agent.validate import check_assign_ids

    with pytest.raises((UnknownTask, InvalidCpus), match=error):
        check_assign_ids(pids, cpus, known_pids={1, 2}, num_cpus=16)
    assert check_assign_ids([2], [3], known_pids={1, 2}, num_cpus=16) == ([2], [3])

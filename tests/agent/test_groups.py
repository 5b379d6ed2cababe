"""GroupTable: the in-memory group bookkeeping SimNode and TraceNode share (agent/groups.py).

The Node contract (tests/agent/contract.py) runs on both nodes; these tests pin the table's
own rules, including the parameters and the ``on_change`` callback that only one of the
nodes uses, on small hand-made capabilities.
"""

from __future__ import annotations

import pickle

import pytest

from agent.errors import (
    GroupExists,
    GroupNotFound,
    InvalidAllocation,
    InvalidCpus,
    ResourceExhausted,
    UnknownTask,
)
from agent.groups import GroupTable, lowest_run
from agent.types import (
    AllocationPlan,
    CacheCapabilities,
    GroupAllocation,
    GroupSpec,
    MbaCapabilities,
    NodeCapabilities,
    Vendor,
)

PIDS = (100, 101, 102, 103)
FULL = 0xFF  # 8 ways


def caps(
    *, l3: bool = True, mba: bool = True, closids: int = 8, sparse: bool = False, min_bits: int = 1
) -> NodeCapabilities:
    return NodeCapabilities(
        vendor=Vendor.INTEL,
        num_cpus=4,
        l3=CacheCapabilities(FULL, min_bits, closids, domains=(0, 1), sparse_masks=sparse)
        if l3
        else None,
        mba=MbaCapabilities(10, 10, 100, closids, domains=(0, 1)) if mba else None,
    )


def table(**kw) -> GroupTable:
    opts = {k: kw.pop(k) for k in ("rmids", "contiguous", "exclusive_free_ways") if k in kw}
    return GroupTable(caps(**kw), PIDS, **opts)


def plan(**groups: GroupAllocation) -> AllocationPlan:
    return AllocationPlan.uniform(groups, (0, 1))


class Calls:
    """An ``on_change`` that records what the table held when it was called."""

    def __init__(self, t: GroupTable) -> None:
        self.table = t
        self.seen: list[tuple] = []

    def __call__(self) -> None:
        t = self.table
        self.seen.append((tuple(t.specs), dict(t.alloc), dict(t.task_group)))


# ------------------------------------------------------------------ helpers


@pytest.mark.parametrize(
    ("mask", "run"),
    [(0, 0), (0b1, 0b1), (0b1100, 0b1100), (0b1101, 0b1), (0b11011000, 0b11000), (-4, 0)],
)
def test_lowest_run(mask: int, run: int) -> None:
    assert lowest_run(mask) == run


# ------------------------------------------------------------------ create


@pytest.mark.parametrize(("l3", "mba"), [(True, True), (True, False), (False, True)])
def test_new_group_holds_every_way_and_full_bandwidth(l3: bool, mba: bool) -> None:
    t = table(l3=l3, mba=mba)
    t.create(GroupSpec("g"))
    want = GroupAllocation(l3_mask=FULL if l3 else None, mb=100 if mba else None)
    assert t.alloc == {"g": want}
    assert t.allocation().get("g", 0) == t.allocation().get("g", 1) == want
    assert t.cpus == {"g": set()} and t.groups() == {"g": GroupSpec("g")}
    assert t.task_group == dict.fromkeys(PIDS, "") and t.tasks("g") == frozenset()


@pytest.mark.parametrize(
    ("contiguous", "want"),
    [(False, 0xC3), (True, 0x03)],  # ways 2-5 held exclusively
)
def test_new_group_avoids_exclusive_ways(contiguous: bool, want: int) -> None:
    t = table(contiguous=contiguous, sparse=not contiguous)
    t.create(GroupSpec("x", exclusive=True))
    t.apply(plan(x=GroupAllocation(l3_mask=0x3C)))
    t.create(GroupSpec("g"))
    assert t.alloc["g"].l3_mask == want


@pytest.mark.parametrize(
    ("free_ways", "others", "want"),
    [
        (True, 0x0F, 0xF0),  # the lowest run no own group uses
        (True, 0x33, 0xC),  # the lowest such run, not all free ways
        (True, 0xFF, 0xFF),  # none free: start like any group, the first plan separates
        (False, 0x0F, 0xFF),  # without the rule: every way not held exclusively
    ],
)
def test_exclusive_group_start(free_ways: bool, others: int, want: int) -> None:
    t = table(exclusive_free_ways=free_ways, sparse=True)
    t.create(GroupSpec("shared"))
    t.apply(plan(shared=GroupAllocation(l3_mask=others)))
    t.create(GroupSpec("mine", exclusive=True))
    assert t.alloc["mine"].l3_mask == want


@pytest.mark.parametrize(
    ("kw", "resource"),
    [
        ({"closids": 3}, "closid"),  # the default group takes one CLOSID
        ({"rmids": 3}, "rmid"),
        ({"exhaust_ways": True}, "ways"),
        ({"exhaust_ways": True, "min_bits": 2}, "ways"),
    ],
)
def test_exhaustion_leaves_the_table_as_it_was(kw: dict, resource: str) -> None:
    exhaust_ways = kw.pop("exhaust_ways", False)
    t = table(**kw)
    t.create(GroupSpec("a", exclusive=exhaust_ways))
    # Exhausting ways: "a" holds all but one way exclusively (one is too few with
    # min_cbm_bits 2) or every way.
    t.apply(plan(a=GroupAllocation(l3_mask=0xFE if kw.get("min_bits") else FULL)))
    if not exhaust_ways:
        t.create(GroupSpec("b"))
    before, held = (dict(t.specs), dict(t.alloc), dict(t.cpus)), t.allocation()
    calls = Calls(t)
    with pytest.raises(ResourceExhausted) as err:
        t.create(GroupSpec("c"), on_change=calls)
    assert err.value.resource == resource
    assert (dict(t.specs), dict(t.alloc), dict(t.cpus)) == before
    assert t.allocation() is held and calls.seen == []


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("op", "error"),
    [
        (lambda t: t.create("g"), TypeError),
        (lambda t: t.create(GroupSpec("a")), GroupExists),
        (lambda t: t.delete("nope"), GroupNotFound),
        (lambda t: t.assign("nope", [100]), GroupNotFound),
        (lambda t: t.tasks("nope"), GroupNotFound),
        (lambda t: t.assign("a", [100, 999]), UnknownTask),
        (lambda t: t.assign("a", [100], [1, 4]), InvalidCpus),
        (lambda t: t.apply(plan(ghost=GroupAllocation(mb=50))), GroupNotFound),
        (lambda t: t.apply(plan(a=GroupAllocation(l3_mask=0x5))), InvalidAllocation),
        (lambda t: t.would_hold(plan(a=GroupAllocation(mb=5))), InvalidAllocation),
    ],
)
def test_a_refused_call_changes_nothing(op, error: type[Exception]) -> None:
    t = table()
    t.create(GroupSpec("a"))
    t.assign("a", [101], [2])
    before = (dict(t.specs), dict(t.alloc), {g: set(c) for g, c in t.cpus.items()})
    tasks, held = dict(t.task_group), t.allocation()
    with pytest.raises(error):
        op(t)
    assert (dict(t.specs), dict(t.alloc), {g: set(c) for g, c in t.cpus.items()}) == before
    assert t.task_group == tasks and t.allocation() is held


# ------------------------------------------------------------------ tasks and CPUs


def test_assign_moves_tasks_and_cpus_out_of_every_other_group() -> None:
    t = table()
    t.create(GroupSpec("a"))
    t.create(GroupSpec("b"))
    assert t.assign("a", [100, 101], [0, 1]) is True
    assert t.assign("b", [101], [1]) is True
    assert t.tasks("a") == {100} and t.tasks("b") == {101}
    assert t.cpus == {"a": {0}, "b": {1}}
    assert t.assign("b", cpus=[0]) is False  # CPUs only: no task moved
    assert t.cpus == {"a": set(), "b": {0, 1}}


@pytest.mark.parametrize(
    ("placed", "want"),
    [
        ({}, ""),  # nothing moved: the default group
        ({100: "a", 101: "a", 102: "b"}, "a"),
        ({100: "a", 101: "a"}, ""),  # a tie with the default group goes to it
        ({100: "b", 101: "b", 102: "a", 103: "a"}, "b"),  # else to the first one seen
    ],
)
def test_majority_group(placed: dict[int, str], want: str) -> None:
    t = table()
    t.create(GroupSpec("a"))
    t.create(GroupSpec("b"))
    for pid, group in placed.items():
        t.assign(group, [pid])
    assert t.majority_group(PIDS) == want


def test_delete_returns_tasks_and_the_row_it_had() -> None:
    t = table()
    for name in ("a", "b", "c"):
        t.create(GroupSpec(name))
    t.assign("b", [100, 102], [3])
    assert t.delete("b") == 1
    assert list(t.specs) == list(t.alloc) == ["a", "c"] and "b" not in t.cpus
    assert t.task_group[100] == t.task_group[102] == ""
    assert "b" not in t.allocation()


# ------------------------------------------------------------------ apply


def test_apply_overlays_each_entry_and_rounds_mb() -> None:
    t = table()
    t.create(GroupSpec("a"))
    t.create(GroupSpec("b"))
    held = t.apply(plan(a=GroupAllocation(l3_mask=0x0F), b=GroupAllocation(mb=15)))
    assert held is t.allocation()
    assert t.alloc == {
        "a": GroupAllocation(l3_mask=0x0F, mb=100),  # MB kept
        "b": GroupAllocation(l3_mask=FULL, mb=20),  # mask kept, MB rounded up
    }


def test_dry_run_returns_the_would_be_allocation_only() -> None:
    t = table()
    t.create(GroupSpec("a"))
    held = t.allocation()
    would = t.apply(plan(a=GroupAllocation(l3_mask=0x3)), dry_run=True)
    assert would.get("a", 1) == GroupAllocation(l3_mask=0x3, mb=100)
    assert t.allocation() is held and t.alloc["a"].l3_mask == FULL


def test_exclusive_groups_constrain_plans() -> None:
    t = table()
    t.create(GroupSpec("a"))
    t.create(GroupSpec("x", exclusive=True))
    t.apply(plan(a=GroupAllocation(l3_mask=0x0F), x=GroupAllocation(l3_mask=0xF0)))
    with pytest.raises(InvalidAllocation) as err:
        t.apply(plan(a=GroupAllocation(l3_mask=0x1F)))
    assert err.value.rule == "exclusive_overlap"


def test_the_read_back_is_one_object_until_something_changes() -> None:
    t = table()
    t.create(GroupSpec("a"))
    first = t.allocation()
    assert t.allocation() is first
    p = plan(a=GroupAllocation(l3_mask=0x3))
    second = t.apply(p)
    assert second is not first and second == t.allocation()
    assert t.apply(p) is second  # what is held already: the same object
    t.create(GroupSpec("b"))
    assert t.allocation() is not second and set(t.allocation()) == {"a", "b"}


# ------------------------------------------------------------------ on_change

# name -> (call with an on_change, whether it changes what the table holds)
CALLS = {
    "create": (lambda t, cb: t.create(GroupSpec("c"), on_change=cb), True),
    "delete": (lambda t, cb: t.delete("a", on_change=cb), True),
    "assign": (lambda t, cb: t.assign("b", [100], [3], on_change=cb), True),
    "apply": (lambda t, cb: t.apply(plan(a=GroupAllocation(mb=30)), on_change=cb), True),
    "cpus only": (lambda t, cb: t.assign("a", cpus=[1], on_change=cb), False),
    "dry run": (
        lambda t, cb: t.apply(plan(a=GroupAllocation(mb=30)), dry_run=True, on_change=cb),
        False,
    ),
    "held plan": (lambda t, cb: t.apply(plan(a=GroupAllocation(mb=100)), on_change=cb), False),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_on_change_runs_once_before_a_change_and_only_then(name: str) -> None:
    t = table()
    t.create(GroupSpec("a"))
    t.create(GroupSpec("b"))
    t.assign("a", [100])
    before = (tuple(t.specs), dict(t.alloc), dict(t.task_group))
    calls = Calls(t)
    call, changes = CALLS[name]
    call(t, calls)
    after = (tuple(t.specs), dict(t.alloc), dict(t.task_group))
    assert calls.seen == ([before] if changes else [])
    assert (after != before) is changes


def test_pickles_with_its_state() -> None:
    t = table(rmids=5, contiguous=True)
    t.create(GroupSpec("a", exclusive=True))
    t.assign("a", [102], [1])
    t.apply(plan(a=GroupAllocation(l3_mask=0x7)))
    twin = pickle.loads(pickle.dumps(t))
    assert (twin.specs, twin.alloc, twin.cpus, twin.task_group) == (
        t.specs,
        t.alloc,
        t.cpus,
        t.task_group,
    )
    assert twin.allocation() == t.allocation() and twin.rmids == 5 and twin.contiguous
    twin.create(GroupSpec("b"))  # the copy is independent
    assert "b" not in t.specs and twin.alloc["b"].l3_mask == 0xF8

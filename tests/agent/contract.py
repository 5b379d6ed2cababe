"""The Node contract: one suite every backend must pass (ResctrlNode, SimNode, RemoteNode).

A backend's test module subclasses :class:`NodeContract` and provides a ``harness``
fixture returning a :class:`NodeHarness`. The class name does not start with ``Test``, so
pytest collects it only through those subclasses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest

from agent.errors import (
    GroupExists,
    GroupNotFound,
    InvalidAllocation,
    InvalidName,
    InvalidPid,
    ResourceExhausted,
    UnknownTask,
)
from agent.node import Node
from agent.types import (
    SLO,
    Allocation,
    AllocationPlan,
    GroupAllocation,
    GroupKind,
    GroupSpec,
    MbaMode,
    StepOutcome,
    contiguous_mask,
)


@dataclass
class NodeHarness:
    """A node under test plus what the contract needs to drive it.

    Attributes:
        node: the node, with no own groups yet.
        pids: existing tasks the tests may move between groups.
        unknown_pid: a pid that names no task.
        tick: let ``seconds`` of (wall or simulated) time pass so counters move.
    """

    node: Node
    pids: Sequence[int]
    unknown_pid: int
    tick: Callable[[float], None]


def _make(node: Node, *names: str) -> None:
    for name in names:
        node.create_group(GroupSpec(name))


class NodeContract:
    """Behaviour every ``Node`` shares. Subclasses provide the ``harness`` fixture."""

    @pytest.fixture
    def node(self, harness: NodeHarness) -> Node:
        return harness.node

    # ------------------------------------------------------------------ capabilities

    def test_capabilities_are_consistent(self, node: Node) -> None:
        caps = node.capabilities()
        assert caps.num_cpus >= 1
        assert caps.num_closids >= 2, "a node needs a CLOSID besides the default group"
        assert caps.domains
        if caps.l3 is not None:
            assert caps.l3.num_ways >= caps.l3.min_cbm_bits >= 0
            assert set(caps.l3.domains) == set(caps.domains)
        if caps.mba is not None and caps.mba.mode is not MbaMode.MBPS:
            assert caps.mba.min_bandwidth <= caps.mba.max_bandwidth
        assert not (caps.pmc_events & set(caps.pmc_unsupported))

    # ------------------------------------------------------------------ groups

    def test_create_group_is_listed_with_its_spec(self, node: Node) -> None:
        spec = GroupSpec("svc", GroupKind.LC, SLO(99.0, 2.0))
        node.create_group(spec)
        node.create_group(GroupSpec("batch0"))
        assert node.groups()["svc"] == spec
        assert set(node.groups()) == {"svc", "batch0"}

    def test_new_group_holds_every_way_and_full_bandwidth(self, node: Node) -> None:
        _make(node, "g")
        caps = node.capabilities()
        for domain in caps.domains:
            alloc = node.allocation().get("g", domain)
            assert alloc is not None
            if caps.l3 is not None:
                assert alloc.l3_mask == caps.l3.cbm_mask
            if caps.mba is not None:
                assert alloc.mb == caps.mba.max_bandwidth

    def test_a_fresh_node_reserves_no_ways(self, node: Node) -> None:
        """Nothing foreign on a fresh node: no ways reserved, groups or not (a backend's own
        tests hold ways exclusively in another tool's name)."""
        assert dict(node.reserved_ways()) == {}
        _make(node, "g")
        assert dict(node.reserved_ways()) == {}

    def test_create_existing_group_fails(self, node: Node) -> None:
        _make(node, "g")
        with pytest.raises(GroupExists):
            _make(node, "g")

    @pytest.mark.parametrize(
        "name", ["", "..", "a/b", "../info", "info", "x" * 65, "a b", "tasks\n"]
    )
    def test_bad_group_names_are_rejected(self, node: Node, name: str) -> None:
        with pytest.raises((InvalidName, ValueError)):
            node.create_group(GroupSpec(name))
        assert node.groups() == {}

    def test_delete_group(self, node: Node) -> None:
        _make(node, "a", "b")
        node.delete_group("a")
        assert set(node.groups()) == {"b"}
        assert "a" not in node.allocation()

    def test_a_re_made_group_has_a_new_generation(self, harness: NodeHarness, node: Node) -> None:
        """A group deleted and made again under the same spec is listed with another
        generation; nothing else (another group's creation, moves, plans, observing, time)
        changes a group's."""
        _make(node, "a", "b")
        listed = node.groups()
        first, kept = listed["a"].generation, listed["b"].generation
        assert first > 0 and kept > 0 and first != kept
        node.assign("a", pids=harness.pids[:1])
        node.apply(self._valid_plan(node))
        harness.tick(0.01)
        node.observe()
        _make(node, "c")
        assert node.groups()["a"].generation == first
        node.delete_group("a")
        _make(node, "a")
        again = node.groups()
        assert again["a"] == listed["a"]  # the same spec ...
        assert again["a"].generation not in (0, first)  # ... but another group
        assert again["b"].generation == kept
        assert again["c"].generation not in (0, again["a"].generation, kept)

    def test_delete_unknown_group_fails(self, node: Node) -> None:
        with pytest.raises(GroupNotFound):
            node.delete_group("nope")

    def test_closid_exhaustion_is_resource_exhausted(self, node: Node) -> None:
        limit = node.capabilities().num_closids
        with pytest.raises(ResourceExhausted):
            for i in range(limit + 1):
                _make(node, f"g{i}")
        # A failed create leaves nothing behind and the node keeps working.
        created = set(node.groups())
        assert 1 <= len(created) < limit
        node.delete_group(sorted(created)[0])
        _make(node, "again")

    # ------------------------------------------------------------------ tasks

    def test_assign_moves_tasks(self, harness: NodeHarness, node: Node) -> None:
        _make(node, "a", "b")
        pid = harness.pids[0]
        node.assign("a", pids=[pid])
        assert pid in node.tasks("a")
        node.assign("b", pids=[pid])
        assert pid in node.tasks("b")
        assert pid not in node.tasks("a"), "a task belongs to exactly one group"

    def test_deleting_a_group_returns_its_tasks(self, harness: NodeHarness, node: Node) -> None:
        _make(node, "a")
        node.assign("a", pids=[harness.pids[0]])
        node.delete_group("a")
        _make(node, "a")
        assert harness.pids[0] not in node.tasks("a")

    def test_unknown_pid_is_a_clear_error(self, harness: NodeHarness, node: Node) -> None:
        _make(node, "a")
        with pytest.raises(UnknownTask) as err:
            node.assign("a", pids=[harness.unknown_pid])
        assert str(harness.unknown_pid) in str(err.value)

    @pytest.mark.parametrize("pid", [0, -5])
    def test_a_pid_that_names_no_task_is_an_invalid_argument(
        self, harness: NodeHarness, node: Node, pid: int
    ) -> None:
        """Not a task that is gone (NOT_FOUND) but a malformed request: InvalidPid, an
        UnknownTask still to code that catches those; nothing moves."""
        _make(node, "a")
        with pytest.raises(InvalidPid, match=f"pid {pid} is not a positive integer") as err:
            node.assign("a", pids=[harness.pids[0], pid])
        assert isinstance(err.value, UnknownTask) and err.value.code == "INVALID_ARGUMENT"
        assert harness.pids[0] not in node.tasks("a")

    def test_assign_to_unknown_group_fails(self, harness: NodeHarness, node: Node) -> None:
        with pytest.raises(GroupNotFound):
            node.assign("nope", pids=[harness.pids[0]])

    # ------------------------------------------------------------------ apply

    def _valid_plan(self, node: Node) -> AllocationPlan:
        caps = node.capabilities()
        per_group = {}
        bits = max(1, caps.l3.min_cbm_bits) if caps.l3 else 0
        for i, name in enumerate(("a", "b")):
            mask = contiguous_mask(bits, i * bits) if caps.l3 else None
            mb = None
            if caps.mba is not None and caps.mba.mode is not MbaMode.MBPS:
                mb = caps.mba.levels()[min(i, len(caps.mba.levels()) - 1)]
            per_group[name] = GroupAllocation(l3_mask=mask, mb=mb)
        return AllocationPlan.uniform(per_group, caps.domains)

    def test_apply_returns_what_the_node_holds(self, node: Node) -> None:
        _make(node, "a", "b")
        plan = self._valid_plan(node)
        held = node.apply(plan)
        assert isinstance(held, Allocation)
        assert held == node.allocation()
        for group, per_domain in plan.groups.items():
            for domain, want in per_domain.items():
                got = held.get(group, domain)
                if want.l3_mask is not None:
                    assert got.l3_mask == want.l3_mask
                if want.mb is not None:
                    assert got.mb == want.mb  # the plan uses exact levels: nothing to round

    def test_dry_run_changes_nothing(self, node: Node) -> None:
        _make(node, "a", "b")
        before = node.allocation()
        node.apply(self._valid_plan(node), dry_run=True)
        assert node.allocation() == before

    @pytest.mark.parametrize("rule", ["contiguous", "mask_range", "min_cbm_bits", "mb_range"])
    def test_invalid_plan_is_rejected_whole(self, node: Node, rule: str) -> None:
        caps = node.capabilities()
        _make(node, "a", "b")
        good = self._valid_plan(node)
        node.apply(good)
        before = node.allocation()
        bad = self._breaking(rule, node)
        if bad is None:
            pytest.skip(f"no way to break {rule!r} on this node's capabilities")
        # "a" is valid and listed first: it must not be applied either.
        plan = AllocationPlan({**good.groups, "b": {d: bad for d in caps.domains}})
        with pytest.raises(InvalidAllocation) as err:
            node.apply(plan)
        assert err.value.rule == rule
        assert node.allocation() == before

    @staticmethod
    def _breaking(rule: str, node: Node) -> GroupAllocation | None:
        caps = node.capabilities()
        l3, mba = caps.l3, caps.mba
        if rule == "contiguous" and l3 and not l3.sparse_masks and l3.num_ways >= 3:
            return GroupAllocation(l3_mask=0b101 if l3.min_cbm_bits <= 2 else 0b1011)
        if rule == "mask_range" and l3:
            return GroupAllocation(l3_mask=l3.cbm_mask + 1 | l3.cbm_mask)
        if rule == "min_cbm_bits" and l3 and l3.min_cbm_bits >= 2:
            return GroupAllocation(l3_mask=0b1)
        if rule == "mb_range" and mba and mba.mode is MbaMode.PERCENT and mba.min_bandwidth > 0:
            return GroupAllocation(mb=mba.min_bandwidth - 1)
        if rule == "mb_range" and mba and mba.mode is MbaMode.PERCENT:
            return GroupAllocation(mb=mba.max_bandwidth + 1)
        return None

    def test_plan_naming_unknown_group_changes_nothing(self, node: Node) -> None:
        _make(node, "a", "b")
        before = node.allocation()
        plan = AllocationPlan({**self._valid_plan(node).groups, "ghost": {}})
        with pytest.raises(GroupNotFound):
            node.apply(plan)
        assert node.allocation() == before

    def test_mb_is_rounded_up_to_the_granularity(self, node: Node) -> None:
        mba = node.capabilities().mba
        if mba is None or mba.mode is not MbaMode.PERCENT or mba.bandwidth_gran < 2:
            pytest.skip("needs percentage MBA with a granularity")
        _make(node, "a")
        ask = mba.levels()[0] + 1
        held = node.apply(
            AllocationPlan.uniform({"a": GroupAllocation(mb=ask)}, node.capabilities().domains)
        )
        for domain in node.capabilities().domains:
            assert held.get("a", domain).mb >= ask

    # ------------------------------------------------------------------ observe

    def test_observe_covers_every_own_group(self, harness: NodeHarness, node: Node) -> None:
        _make(node, "a", "b")
        node.assign("a", pids=[harness.pids[0]])
        node.observe()
        harness.tick(0.05)
        snap = node.observe()
        assert set(snap.groups) == {"a", "b"}
        assert snap.interval_s > 0
        for sample in snap.groups.values():
            for value in (
                sample.instructions,
                sample.cycles,
                sample.llc_references,
                sample.llc_misses,
                sample.llc_occupancy_bytes,
                sample.memory_bytes,
            ):
                assert value is None or (value >= 0 and math.isfinite(value))

    def test_snapshot_time_moves_forward(self, harness: NodeHarness, node: Node) -> None:
        _make(node, "a")
        first = node.observe()
        harness.tick(0.02)
        second = node.observe()
        assert second.timestamp > first.timestamp

    # ------------------------------------------------------------------ step

    def test_step_applies_then_observes(self, harness: NodeHarness, node: Node) -> None:
        _make(node, "a", "b")
        plan = self._valid_plan(node)
        node.observe()
        harness.tick(0.02)
        out = node.step(plan)
        assert isinstance(out, StepOutcome)
        assert out.allocation == node.allocation() == node.apply(plan)
        assert set(out.snapshot.groups) == {"a", "b"} and out.snapshot.interval_s > 0
        harness.tick(0.02)
        alone = node.step()  # no plan: an observation only
        assert alone.allocation is None
        assert alone.snapshot.timestamp > out.snapshot.timestamp

    def test_step_with_a_refused_plan_changes_and_observes_nothing(
        self, harness: NodeHarness, node: Node
    ) -> None:
        _make(node, "a", "b")
        before = node.allocation()
        node.observe()
        harness.tick(0.02)
        with pytest.raises(GroupNotFound):
            node.step(AllocationPlan({**self._valid_plan(node).groups, "ghost": {}}))
        assert node.allocation() == before
        harness.tick(0.02)
        # The refused step took no observation: the next one spans both ticks.
        assert node.observe().interval_s >= 0.04 - 1e-9

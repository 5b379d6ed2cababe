"""The MB maximum a plan is checked against on AMD, where ``info/MB`` names none: learnt
from a group the node makes (the kernel starts a new group at the hardware maximum,
rdtgroup_init_mba), kept in the state file, and not guessed below it before."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from agent.errors import InvalidAllocation, KernelError
from agent.resctrl import ResctrlNode
from agent.types import AllocationPlan, GroupAllocation, GroupSpec
from tests.emulated_resctrl import Emulated, emulated_resctrl

HARDWARE_MAX = 2048  # the amd-epyc preset's (1 << CPUID's bandwidth length)
THROTTLE = 256


@pytest.fixture
def amd() -> Iterator[Emulated]:
    """An AMD node whose administrator throttled the default group before the agent's
    first start, with a runtime class made since, throttled too."""
    with emulated_resctrl("amd-epyc") as emu:
        line = "MB:" + ";".join(f"{d}={THROTTLE}" for d in range(8)) + "\n"
        emu.write("schemata", line)
        os.mkdir(os.path.join(emu.root, "cls"))
        emu.write("cls/schemata", line)
        yield emu


def _node(emu: Emulated) -> ResctrlNode:
    return ResctrlNode(emu.root, state_dir=emu.state_dir, pmc=None, runtime_classes=["cls"])


def _mb(group: str, mb: int) -> AllocationPlan:
    return AllocationPlan({group: {0: GroupAllocation(mb=mb)}})


def test_the_mb_maximum_is_learnt_from_a_group_made_and_kept_across_a_restart(
    amd: Emulated,
) -> None:
    node = _node(amd)
    assert node.capabilities().mba.max_bandwidth == THROTTLE  # what groups hold, so far
    node.create_group(GroupSpec("lc"))
    assert node.capabilities().mba.max_bandwidth == HARDWARE_MAX
    assert node.apply(_mb("lc", 1024)).get("lc", 0).mb == 1024
    with pytest.raises(InvalidAllocation) as err:
        node.apply(_mb("lc", HARDWARE_MAX + 1))
    assert err.value.rule == "mb_range"
    node.close()
    with open(node.state_path) as f:
        assert json.load(f)["mb_max"] == HARDWARE_MAX
    again = _node(amd)  # every group now holds at most 1024
    try:
        assert again.capabilities().mba.max_bandwidth == HARDWARE_MAX
        assert again.apply(_mb("lc", HARDWARE_MAX)).get("lc", 0).mb == HARDWARE_MAX
    finally:
        again.close()


@pytest.mark.parametrize(
    ("mb", "refused"),
    [(1024, None), (HARDWARE_MAX + 1, f"MB value {HARDWARE_MAX + 1} out of range")],
    ids=["within the hardware's", "above it"],
)
def test_before_the_maximum_is_learnt_the_kernel_judges_values_above_what_groups_hold(
    amd: Emulated, mb: int, refused: str | None
) -> None:
    node = _node(amd)
    try:
        node.create_group(GroupSpec("cls"))  # adopted, not made: nothing learnt
        assert node.capabilities().mba.max_bandwidth == THROTTLE
        if refused is None:
            assert node.apply(_mb("cls", mb)).get("cls", 0).mb == mb
        else:
            with pytest.raises(KernelError, match=refused):
                node.apply(_mb("cls", mb))
            assert node.allocation().get("cls", 0).mb == THROTTLE
    finally:
        node.close()

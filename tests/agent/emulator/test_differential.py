"""Differential test: the emulator (a model of the kernel's C) and agent/validate.py (the
validator every backend uses) were written independently; for any mask and MB value they
must agree on accept/reject, and on the MB value after rounding. A disagreement is a bug
in one of them that sharing code would have hidden."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.emulator.model import ResctrlError
from agent.errors import InvalidAllocation
from agent.resctrl.discovery import discover
from agent.types import Allocation, AllocationPlan, GroupAllocation, MbaMode
from agent.validate import PlanContext, validate_plan
from tests.emulated_resctrl import PRESET_NAMES, Emulated, emulated_resctrl


@pytest.fixture(scope="module", params=PRESET_NAMES)
def mounted(request: pytest.FixtureRequest) -> Iterator[tuple[Emulated, object]]:
    with emulated_resctrl(request.param) as emu:
        emu.model.mkdir("/g")
        yield emu, discover(emu.root)


def _kernel_accepts(emu: Emulated, text: str) -> bool:
    try:
        emu.model.write("/g/schemata", text.encode())
    except ResctrlError:
        return False
    return True


def _validator_accepts(caps, alloc: GroupAllocation) -> GroupAllocation | None:
    current = Allocation({"g": {d: GroupAllocation() for d in caps.domains}})
    try:
        plan = validate_plan(AllocationPlan({"g": {0: alloc}}), PlanContext(caps, current))
    except InvalidAllocation:
        return None
    return plan.get("g", 0)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(mask=st.integers(min_value=0, max_value=(1 << 22) - 1))
def test_masks_agree(mounted, mask: int) -> None:
    emu, caps = mounted
    name = "L3DATA" if caps.l3.cdp else "L3"
    kernel = _kernel_accepts(emu, f"{name}:0={mask:x}\n")
    ours = _validator_accepts(caps, GroupAllocation(l3_mask=mask))
    assert kernel == (ours is not None), (
        f"mask {mask:#x}: kernel {'accepts' if kernel else 'refuses'} "
        f"({emu.model.status}), validator disagrees"
    )


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(mb=st.integers(min_value=0, max_value=5000))
def test_mb_values_agree_and_round_alike(mounted, mb: int) -> None:
    emu, caps = mounted
    if caps.mba is None:
        pytest.skip("no MBA on this preset")
    kernel = _kernel_accepts(emu, f"MB:0={mb}\n")
    ours = _validator_accepts(caps, GroupAllocation(mb=mb))
    if caps.mba.mode is MbaMode.MBPS and mb == 0:
        # The kernel takes any u32 in mba_MBps mode; the validator refuses a 0 MiB/s cap
        # on purpose (it would starve the group).
        assert kernel and ours is None
        return
    assert kernel == (ours is not None), f"MB {mb}: kernel {emu.model.status!r}"
    if kernel:
        assert emu.model.groups["g"].ctrl["MB"][0] == ours.mb, "rounded differently"


@pytest.fixture(scope="module")
def with_exclusive() -> Iterator[tuple[Emulated, object]]:
    with emulated_resctrl("intel-20way") as emu:
        emu.write("schemata", "L3:0=00003;1=00003\n")
        emu.model.mkdir("/x")
        emu.write("x/schemata", "L3:0=00f00;1=00f00\n")
        emu.write("x/mode", "exclusive\n")
        emu.model.mkdir("/g")
        yield emu, discover(emu.root)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(mask=st.integers(min_value=1, max_value=(1 << 20) - 1))
def test_exclusive_overlap_agrees(with_exclusive, mask: int) -> None:
    emu, caps = with_exclusive
    kernel = _kernel_accepts(emu, f"L3:0={mask:x}\n")
    current = Allocation({"g": {d: GroupAllocation(l3_mask=0x3) for d in caps.domains}})
    ctx = PlanContext(
        caps,
        current,
        exclusive=frozenset({"x"}),
        others={"": {0: 0x3, 1: 0x3}, "x": {0: 0xF00, 1: 0xF00}},
    )
    try:
        validate_plan(AllocationPlan({"g": {0: GroupAllocation(l3_mask=mask)}}), ctx)
        ours = True
    except InvalidAllocation:
        ours = False
    assert kernel == ours, f"mask {mask:#x}: kernel {emu.model.status!r}"

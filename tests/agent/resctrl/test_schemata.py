"""Schemata text: parsed by value (padding, CDP, partial domains), written minimally."""

from __future__ import annotations

import pytest

from agent.resctrl.schemata import SchemataError, changes_for, format_write, parse
from agent.types import GroupAllocation


@pytest.mark.parametrize(
    "text",
    [
        "L3:0=000ff;1=fffff\nMB:0=100;1=50\n",
        "L3:0=000ff;1=fffff\nMB:0=  100;1=   50\n",
        "  L3:0=000ff;1=fffff\n  MB:0= 100;1=  50\n",
        "\n L3 : 0 = ff ; 1=FFFFF \nMB:0=100;1=50",
    ],
)
def test_padding_is_ignored(text: str) -> None:
    s = parse(text)
    assert s.resources == {"L3": {0: 0xFF, 1: 0xFFFFF}, "MB": {0: 100, 1: 50}}
    assert s.allocation(1, cdp=False) == GroupAllocation(l3_mask=0xFFFFF, mb=50)


def test_cdp_lines_map_to_data_and_code_masks() -> None:
    s = parse("L3DATA:0=000f0\nL3CODE:0=0000f\n    MB:0=  100\n")
    assert s.allocation(0, cdp=True) == GroupAllocation(l3_mask=0xF0, mb=100, l3_code_mask=0xF)


def test_partial_and_unknown_resources() -> None:
    s = parse("L3:1=3\nSMBA:0=2048\nL2:0=ff\n")
    assert s.allocation(0, cdp=False) == GroupAllocation()
    assert s.get("SMBA", 0) == 2048 and s.get("L2", 0) == 0xFF
    assert s.domains() == (0, 1)


@pytest.mark.parametrize("text", ["L3", "L3:0", "L3:x=ff", "L3:0=zz", "MB:0=ten", ":0=1"])
def test_garbage_is_a_clear_error(text: str) -> None:
    with pytest.raises(SchemataError):
        parse(text)


def test_format_names_only_what_changes_and_ends_in_newline() -> None:
    held = parse("L3:0=fffff;1=fffff\nMB:0=100;1=100\n")
    want = {0: GroupAllocation(l3_mask=0xFF, mb=100), 1: GroupAllocation(mb=40)}
    changes = changes_for(want, held, cdp=False)
    assert changes == {"L3": {0: 0xFF}, "MB": {1: 40}}
    assert format_write(changes, mask_digits=5) == "L3:0=000ff\nMB:1=40\n"
    assert format_write({}) == ""


def test_cdp_plain_mask_sets_code_and_data() -> None:
    held = parse("L3DATA:0=fffff\nL3CODE:0=fffff\n")
    assert changes_for({0: GroupAllocation(l3_mask=0xF)}, held, cdp=True) == {
        "L3DATA": {0: 0xF},
        "L3CODE": {0: 0xF},
    }
    split = GroupAllocation(l3_mask=0xF0, l3_code_mask=0xFFFFF)
    assert changes_for({0: split}, held, cdp=True) == {"L3DATA": {0: 0xF0}}


def test_round_trip() -> None:
    changes = {"L3": {0: 0x3, 1: 0xF0}, "MB": {0: 20, 1: 100}}
    assert parse(format_write(changes)).resources == changes


def test_mb_is_written_after_the_masks() -> None:
    # With mba_MBps the kernel keeps an MB value parsed before a line it refuses
    # (tests/agent/emulator/test_kernel_behaviour.py): masks first, so a refused mask
    # leaves nothing applied.
    changes = changes_for(
        {0: GroupAllocation(mb=50), 1: GroupAllocation(l3_mask=0xFF)},
        parse("L3:0=fffff;1=fffff\nMB:0=100;1=100\n"),
        cdp=False,
    )
    assert list(changes) == ["MB", "L3"]
    assert format_write(changes, 5) == "L3:1=000ff\nMB:0=50\n"


def test_a_pseudo_locksetup_group_reads_as_no_values() -> None:
    # rdtgroup_schemata_show's text for a group in pseudo-locksetup mode (another tool's):
    # no ways of its own to keep clear of, not a malformed file that would fail every apply.
    held = parse("L3:uninitialized\nMB:uninitialized\n")
    assert held.resources == {"L3": {}, "MB": {}}
    assert held.allocation(0, cdp=False) == GroupAllocation()

"""Capabilities discovered from every emulator preset match the preset, and mount options
come from /proc/mounts when the root is a real resctrl mount."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from agent.emulator.presets import get_preset
from agent.resctrl import ResctrlNode
from agent.resctrl.discovery import (
    discover,
    format_cpu_list,
    mount_info,
    parse_cpu_list,
    parse_size,
)
from agent.types import AllocationPlan, GroupAllocation, GroupSpec, MbaMode, Vendor
from tests.emulated_resctrl import Emulated, emulated_resctrl


def test_capabilities_match_the_preset(emu: Emulated, preset: str) -> None:
    p = get_preset(preset)
    caps = discover(emu.root, cache_size_path="/nonexistent")
    assert caps.l3 is not None
    assert caps.l3.cbm_mask == p.cbm_mask
    assert caps.l3.min_cbm_bits == p.min_cbm_bits
    assert caps.l3.cdp == p.cdp
    assert caps.l3.domains == p.domains
    assert caps.l3.shareable_bits == p.shareable_bits
    assert caps.l3.size_bytes == p.cache_size, "from the root group's size file"
    assert caps.num_cpus == p.cpus_online
    assert caps.num_closids == emu.model.num_closids
    assert caps.monitoring is not None and caps.monitoring.num_rmids == p.num_rmids
    assert caps.monitoring.domains == p.domains
    if p.mb is None:
        assert caps.mba is None
    else:
        assert caps.mba is not None
        expected = (
            MbaMode.MBPS
            if p.mba_mbps
            else MbaMode.AMD
            if p.vendor == "AuthenticAMD"
            else MbaMode.PERCENT
        )
        assert caps.mba.mode is expected
        assert caps.mba.bandwidth_gran == p.mb.bandwidth_gran
        if expected is MbaMode.AMD:
            assert caps.vendor is Vendor.AMD and caps.mba.max_bandwidth == 2048


def test_real_mount_options_win(tmp_path: Path) -> None:
    from tests.emulated_resctrl import emulated_resctrl

    with emulated_resctrl("intel-20way") as emu:
        mounts = tmp_path / "mounts"
        mounts.write_text(f"resctrl {emu.root} resctrl rw,relatime,mba_MBps 0 0\n")
        caps = discover(emu.root, mounts=str(mounts))
        assert caps.mba is not None and caps.mba.mode is MbaMode.MBPS
        assert mount_info(emu.root, str(mounts)).options >= {"mba_MBps"}
        size = tmp_path / "size"
        size.write_text("35840K\n")
        assert discover(emu.root, cache_size_path=str(size)).l3.size_bytes == 40 * 1024 * 1024


@pytest.mark.parametrize(("text", "value"), [("35840K", 36700160), ("32M", 33554432), ("x", None)])
def test_parse_size(text: str, value: int | None) -> None:
    assert parse_size(text) == value


def test_not_resctrl_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a resctrl filesystem"):
        discover(str(tmp_path))
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        (set(), ""),
        ({3}, "3"),
        ({0, 1, 2, 5}, "0-2,5"),
        ({0, 2}, "0,2"),
        (set(range(1024)), "0-1023"),
    ],
)
def test_cpu_lists_are_written_as_ranges(cpus: set[int], text: str) -> None:
    # kernfs takes at most a page per write: 1024 CPUs one by one would be ~4.9 KB.
    assert format_cpu_list(cpus) == text
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("preset", ["amd-epyc", "intel-mbps"])
def test_a_throttled_default_group_is_not_the_mb_maximum(preset: str) -> None:
    with emulated_resctrl(preset) as emu:
        mba = discover(emu.root).mba
        full = mba.max_bandwidth
        os.mkdir(os.path.join(emu.root, "other"))  # another tool's group, at the maximum
        # An administrator throttles the default group in every domain.
        emu.write("schemata", "MB:" + ";".join(f"{d}=1024" for d in mba.domains) + "\n")
        assert "1024" in emu.read("schemata")
        assert discover(emu.root).mba.max_bandwidth == full


@pytest.mark.parametrize(
    ("preset", "overrides", "mode"),
    [
        ("amd-epyc", {}, ""),  # AMD has no thread throttle mode: not said to be "max"
        ("intel-20way", {}, "max"),
        ("intel-20way", {"thread_throttle_mode": None}, "max"),  # kernels before 5.10
    ],
)
def test_the_throttle_mode_is_the_kernels_or_what_the_cpu_does_without_it(
    preset: str, overrides: dict, mode: str
) -> None:
    p = get_preset(preset)
    if overrides:
        overrides = {"mb": dataclasses.replace(p.mb, **overrides)}
    with emulated_resctrl(preset, **overrides) as emu:
        assert discover(emu.root).mba.throttle_mode == mode


def test_amd_masks_may_be_sparse_or_empty() -> None:
    """AMD's L3 QoS (rdt_init_res_defs_amd): sparse masks and no minimum of ways; the
    backend discovers both and applies such masks, read back as they were written."""
    with emulated_resctrl("amd-epyc") as emu:
        l3 = discover(emu.root).l3
        assert (l3.sparse_masks, l3.min_cbm_bits) == (True, 0)
        node = ResctrlNode(emu.root, state_dir=emu.state_dir, pmc=None)
        node.create_group(GroupSpec("a"))
        plan = AllocationPlan({"a": {0: GroupAllocation(l3_mask=0xF0F), 1: GroupAllocation(0)}})
        held = node.apply(plan)
        assert (held.get("a", 0).l3_mask, held.get("a", 1).l3_mask) == (0xF0F, 0)
        node.close()


@pytest.mark.parametrize("peak", [None, 110e9])
def test_the_peak_memory_bandwidth_is_the_operators(peak: float | None) -> None:
    """The kernel reports no peak bandwidth: a node has the one it is given, or none."""
    with emulated_resctrl("intel-20way") as emu:
        node = ResctrlNode(emu.root, state_dir=emu.state_dir, memory_bandwidth_bps=peak)
        try:
            assert node.capabilities().memory_bandwidth_bps == peak
        finally:
            node.close()


@pytest.mark.parametrize("peak", [0.0, -1e9, float("nan"), float("inf")])
def test_a_peak_memory_bandwidth_that_cannot_be_refuses_the_start(peak: float) -> None:
    with emulated_resctrl("intel-20way") as emu:
        with pytest.raises(ValueError, match="memory_bandwidth_bps"):
            ResctrlNode(emu.root, state_dir=emu.state_dir, memory_bandwidth_bps=peak)
        ResctrlNode(emu.root, state_dir=emu.state_dir).close()  # nothing left held

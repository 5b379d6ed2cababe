"""Interoperability: Intel's own pqos (intel-cmt-cat, OS interface ``-I``) drives the
emulator, and every effect is checked by reading the emulated files, never by pqos's exit
status alone (tests/agent/emulator/pqos.py runs it: a private mount namespace, and on a
non-Intel host qemu-user with an Intel CPU model).

Capability (``-d``, ``-D``), allocation (``-e``, ``-s``), association (``-a llc:``,
``-a pid:``), core and PID monitoring (``-m``, ``-p``) and reset (``-R``) are covered on the
two-socket intel-20way preset, whose L3 ids pqos reads from the emulated sysfs topology.
IPC and LLC-miss counting go through perf, not resctrl, so monitoring runs pass
``--disable-mon-ipc --disable-mon-llc_miss``. Without pqos (or qemu-user on a non-Intel
host) the tests skip, and fail under RDTUNE_REQUIRE_FUSE=1 (CI), like the FUSE tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from agent.emulator.bitmap import parse_list
from tests.agent.emulator.pqos import Pqos, finish, host_vendor, pqos_command
from tests.emulated_resctrl import Emulated, emulated_resctrl

NO_PERF = ("--disable-mon-ipc", "--disable-mon-llc_miss")
# A monitoring run: a read every 0.5 s (-i 5) for 1 s (-t 1), so two or three reads; the
# tests look at the groups while it runs and at the reads it printed, not at how long it ran.
MONITOR_FOR = ("-i", "5", "-t", "1")


@pytest.fixture
def pqos() -> Iterator[Pqos]:
    with emulated_resctrl("intel-20way") as emu:
        runner = Pqos.for_emulator(emu)
        try:
            yield runner
        finally:
            runner.close()


# ---------------------------------------------------------------- reading the emulated tree


def schemata(emu: Emulated, group: str) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for line in emu.read(os.path.join(group, "schemata")).splitlines():
        name, _, rest = line.partition(":")
        base = 10 if name.strip() == "MB" else 16
        out[name.strip()] = {
            int(d): int(v, base) for d, v in (item.split("=") for item in rest.split(";"))
        }
    return out


def cpus(emu: Emulated, group: str) -> set[int]:
    return parse_list(emu.read(os.path.join(group, "cpus_list")), 1 << 12)


def tasks(emu: Emulated, group: str) -> set[int]:
    return {int(x) for x in emu.read(os.path.join(group, "tasks")).split()}


def mon_groups(emu: Emulated) -> dict[str, str]:
    """Every monitoring group: its path -> the control group it lives in ("" = default)."""
    out = {}
    for ctrl in ["", *[e for e in os.listdir(emu.root) if e.startswith("COS")]]:
        for m in os.listdir(os.path.join(emu.root, ctrl, "mon_groups")):
            out[os.path.join(ctrl, "mon_groups", m)] = ctrl
    return out


def wait_for(what: Callable[[], bool], proc: subprocess.Popen, why: str) -> None:
    deadline = time.monotonic() + 30
    while not what():
        if proc.poll() is not None:
            pytest.fail(f"pqos ended before {why}:\n{finish(proc)}")
        assert time.monotonic() < deadline, f"timed out waiting until {why}"
        time.sleep(0.05)


def full(emu: Emulated) -> dict[str, dict[int, int]]:
    p = emu.model.p
    assert p.mb is not None
    return {"L3": {0: p.cbm_mask, 1: p.cbm_mask}, "MB": {0: 100, 1: 100}}


# ---------------------------------------------------------------- the tests


def test_vendor_decides_how_pqos_runs() -> None:
    command, why = pqos_command(host_vendor())
    if why is None and host_vendor() != "GenuineIntel":
        assert command[:3] == [command[0], "-cpu", "Skylake-Server"]
        assert command[0].endswith("qemu-x86_64")
    elif why is None:
        assert len(command) == 1 and command[0].endswith("pqos")


def test_capabilities(pqos: Pqos) -> None:
    emu = pqos.emu
    out = pqos.run("-d")
    num_cos = min(int(emu.read("info/L3/num_closids")), int(emu.read("info/MB/num_closids")))
    assert "L3 CAT" in out and "Memory Bandwidth Allocation (MBA)" in out, out
    assert out.count(f"Num COS: {num_cos}") == 2, out
    # pqos prepares one resctrl group per class of service on start-up (os_alloc_prep)
    assert sorted(e for e in os.listdir(emu.root) if e.startswith("COS")) == [
        f"COS{i}" for i in range(1, num_cos)
    ]
    assert all(schemata(emu, f"COS{i}") == full(emu) for i in range(1, num_cos))

    out = pqos.run("-D")
    cbm = int(emu.read("info/L3/cbm_mask"), 16)
    assert f"max rmid: {int(emu.read('info/L3_MON/num_rmids'))}" in out, out
    assert f"Ways contention bit-mask: 0x{int(emu.read('info/L3/shareable_bits'), 16):x}" in out
    assert f"Min CBM bits: {int(emu.read('info/L3/min_cbm_bits'))}" in out
    assert f"Max CBM bits: {cbm.bit_count()}" in out
    assert f"Granularity: {int(emu.read('info/MB/bandwidth_gran'))}" in out
    assert f"Min B/W: {int(emu.read('info/MB/min_bandwidth'))}" in out
    assert "exit status 0" in out


def test_allocation_is_written_and_shown(pqos: Pqos) -> None:
    emu = pqos.emu
    pqos.run("-d")
    out = pqos.run("-e", "llc:1=0x000f;mba:1=50")
    assert schemata(emu, "COS1") == {"L3": {0: 0xF, 1: 0xF}, "MB": {0: 50, 1: 50}}, out
    out = pqos.run("-e", "llc@1:2=0xf0")  # socket 1 only: the L3 with cache id 1
    assert schemata(emu, "COS2")["L3"] == {0: 0xFFFFF, 1: 0xF0}, out
    assert emu.status() == "ok"

    # -s must report, socket by socket, exactly what the emulated schemata hold.
    shown = pqos.run("-s")
    for sock in (0, 1):
        section = shown.split(f"COS definitions for Socket {sock}:")[1].split("definitions")[0]
        for cos in range(8):
            held = schemata(emu, f"COS{cos}" if cos else "")
            assert f"L3CA COS{cos} => MASK 0x{held['L3'][sock]:x}\n" in section, shown
            assert f"MBA COS{cos} => {held['MB'][sock]}% available" in section, shown


def test_association_of_cores_and_tasks(pqos: Pqos, child: int) -> None:
    emu = pqos.emu
    pqos.run("-d")
    out = pqos.run("-a", "llc:1=0-1")  # pqos writes the mask with a trailing comma: "03,"
    assert cpus(emu, "COS1") == {0, 1}, out
    out = pqos.run("-a", "llc:3=6-7")
    assert cpus(emu, "COS3") == {6, 7}, out
    assert cpus(emu, "") == {2, 3, 4, 5}
    out = pqos.run("-a", f"pid:2={child}")
    assert tasks(emu, "COS2") == {child}, out
    assert child not in tasks(emu, "")

    shown = pqos.run("-s")
    for core, cos in ((0, 1), (1, 1), (2, 0), (6, 3), (7, 3)):
        assert re.search(rf"Core {core}, L2ID \d+, L3ID \d+ => COS{cos}\n", shown), shown
    assert f"COS2 => {child}\n" in shown, shown


@pytest.mark.slow
def test_core_monitoring(pqos: Pqos) -> None:
    emu = pqos.emu
    pqos.run("-d")
    pqos.run("-a", "llc:1=0-1")
    proc = pqos.start("-m", "llc:[0-1];mbl:6", *NO_PERF, *MONITOR_FOR)
    try:

        def grouped() -> bool:
            held = {g: cpus(emu, g) for g in mon_groups(emu)}
            return {0, 1} in held.values() and {6} in held.values()

        wait_for(grouped, proc, "pqos put cores 0-1 and 6 in monitoring groups")
        for group, ctrl in mon_groups(emu).items():
            # a monitoring group holds only CPUs of its control group (cpus_mon_write)
            assert cpus(emu, group) <= cpus(emu, ctrl), (group, ctrl)
            expected_ctrl = "COS1" if cpus(emu, group) == {0, 1} else ""
            assert ctrl == expected_ctrl, (group, ctrl)
    finally:
        out = finish(proc)
    assert mon_groups(emu) == {}, f"pqos left monitoring groups behind:\n{out}"
    assert cpus(emu, "COS1") == {0, 1} and cpus(emu, "") == set(range(2, 8))
    assert re.search(r"\n\s+0-1\s+\d+\.\d", out), out  # LLC occupancy read for cores 0-1
    assert "exit status 0" in out, out


@pytest.mark.slow
def test_pid_monitoring_of_every_thread(pqos: Pqos, threaded: int) -> None:
    emu = pqos.emu
    every = {int(t) for t in os.listdir(f"/proc/{threaded}/task")}
    others = every - {threaded}
    pqos.run("-d")
    pqos.run("-a", f"pid:2={threaded}")  # the main thread only: the others stay in COS0
    assert tasks(emu, "COS2") == {threaded} and others <= tasks(emu, "")
    proc = pqos.start("-p", f"llc:{threaded}", *NO_PERF, *MONITOR_FOR)
    try:

        def monitored() -> bool:
            held = set()
            for g in mon_groups(emu):
                held |= tasks(emu, g)
            return held == every

        wait_for(monitored, proc, "pqos moved every thread into monitoring groups")
        for group, ctrl in mon_groups(emu).items():
            assert tasks(emu, group) == ({threaded} if ctrl == "COS2" else others), group
        # a control group still lists the tasks of its monitoring groups
        assert tasks(emu, "COS2") == {threaded} and others <= tasks(emu, "")
    finally:
        out = finish(proc)
    assert mon_groups(emu) == {}, f"pqos left monitoring groups behind:\n{out}"
    assert tasks(emu, "COS2") == {threaded} and others <= tasks(emu, ""), out
    assert "Failed" not in out and "exit status 0" in out, out


def test_reset(pqos: Pqos, child: int) -> None:
    emu = pqos.emu
    pqos.run("-d")
    pqos.run("-e", "llc:3=0x3;mba:3=20")
    pqos.run("-a", "llc:3=6-7")
    pqos.run("-a", f"pid:3={child}")
    assert schemata(emu, "COS3") == {"L3": {0: 3, 1: 3}, "MB": {0: 20, 1: 20}}
    assert cpus(emu, "COS3") == {6, 7} and tasks(emu, "COS3") == {child}
    out = pqos.run("-R")
    for cos in range(1, 8):
        assert schemata(emu, f"COS{cos}") == full(emu), out
        assert cpus(emu, f"COS{cos}") == set() and tasks(emu, f"COS{cos}") == set(), out
    assert cpus(emu, "") == set(range(8)) and child in tasks(emu, "")
    assert "Allocation reset successful" in out, out

"""The emulator behaves like the kernel's resctrl (docs/EMULATOR.md), seen through
the FUSE mount with plain syscalls: errno plus info/last_cmd_status for each refusal,
padding, move semantics, rmdir, allocation of CLOSIDs and RMIDs, counters."""

from __future__ import annotations

import errno
import os
import time

import pytest

from agent.emulator.model import Model
from agent.emulator.presets import PRESETS, get_preset
from agent.resctrl.schemata import parse
from tests.emulated_resctrl import Emulated, emulated_resctrl


def refused(emu: Emulated, rel: str, text: str) -> tuple[int, str]:
    with pytest.raises(OSError) as err:
        emu.write(rel, text)
    return err.value.errno, emu.status()


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("L3\n", "Missing ':'"),
        ("XX:0=ff\n", "Unknown or unsupported resource name 'XX'"),
        ("L3:a=ff\n", "Missing '=' or non-numeric domain"),
        ("L3:0ff\n", "Missing '=' or non-numeric domain"),
        # parse_line stops at the line's end only: an empty item is a domain without '='
        ("L3:0=ff;;1=ff\n", "Missing '=' or non-numeric domain"),
        ("L3:;0=ff\n", "Missing '=' or non-numeric domain"),
        ("L3:0=ff;;\n", "Missing '=' or non-numeric domain"),
        ("L3:0=ff;0=f\n", "Duplicate domain 0"),
        ("L3:0=zz\n", "Non-hex character in the mask zz"),
        ("L3:0=0x\n", "Non-hex character in the mask 0x"),
        ("L3:0=+-f\n", "Non-hex character in the mask +-f"),
        ("L3:0=++f\n", "Non-hex character in the mask ++f"),
        # kstrtoul's ERANGE is reported as any parse failure, not as a mask out of range
        ("L3:0=1" + "0" * 16 + "\n", "Non-hex character in the mask 1" + "0" * 16),
        ("L3:0=1fffff\n", "Mask out of range"),
        ("L3:0=0\n", "Mask out of range"),
        ("L3:0=f7\n", "The mask f7 has non-consecutive 1-bits"),
        ("MB:0=x\n", "Invalid MB value x"),
        ("MB:0=-50\n", "Invalid MB value -50"),
        ("MB:0=0x32\n", "Invalid MB value 0x32"),
        ("MB:0=\uff15\uff10\n", "Invalid MB value \uff15\uff10"),  # not ASCII digits
        ("MB:0=4294967296\n", "Invalid MB value 4294967296"),  # kstrtou32's ERANGE
        ("MB:0=5\n", "MB value 5 out of range [10,100]"),
        ("MB:0=101\n", "MB value 101 out of range [10,100]"),
        ("L3:7=ff\n", "ok"),  # unknown domain id: EINVAL, and the kernel says nothing
    ],
)
def test_schemata_errors_set_errno_and_status(emu: Emulated, text: str, status: str) -> None:
    os.mkdir(f"{emu.root}/g")
    before = emu.read("g/schemata")
    assert refused(emu, "g/schemata", text) == (errno.EINVAL, status)
    assert emu.read("g/schemata") == before


@pytest.mark.parametrize(
    ("rel", "data", "status"),
    [
        # strim() trims the ASCII whitespace isspace() knows, no other control character
        ("g/schemata", b"L3:0=ff\x1f\n", b"Non-hex character in the mask ff\x1f"),
        ("g/schemata", b"\x1cL3:0=ff\n", b"Unknown or unsupported resource name '\x1cL3'"),
        # bytes that are no UTF-8 reach the command's parser, which repeats them
        ("g/schemata", b"L3:0=f\xff\n", b"Non-hex character in the mask f\xff"),
        ("g/tasks", b"1\xfe\n", None),  # 6.1: one pid, refused before the status is reset
    ],
)
def test_a_write_is_parsed_as_bytes_as_the_kernel_parses_it(
    emu: Emulated, rel: str, data: bytes, status: bytes | None
) -> None:
    os.mkdir(f"{emu.root}/g")
    refused(emu, "g/schemata", "L3\n")  # a status left by the command before
    fd = os.open(f"{emu.root}/{rel}", os.O_WRONLY)
    try:
        with pytest.raises(OSError) as err:
            os.write(fd, data)
    finally:
        os.close(fd)
    assert err.value.errno == errno.EINVAL
    with open(f"{emu.root}/info/last_cmd_status", "rb") as f:
        left = f.read()
    assert left == (b"Missing ':'" if status is None else status) + b"\n"


@pytest.mark.parametrize("parent", ["mon_groups", "a/mon_groups"])
def test_no_monitoring_group_is_named_mon_groups(emu: Emulated, parent: str) -> None:
    """rdtgroup_mkdir's is_mon_groups: a mon_groups directory takes monitoring groups of
    any name but its own."""
    os.mkdir(f"{emu.root}/a")
    with pytest.raises(PermissionError):
        os.mkdir(f"{emu.root}/{parent}/mon_groups")
    os.mkdir(f"{emu.root}/{parent}/m")
    assert os.listdir(f"{emu.root}/{parent}") == ["m"]


@pytest.mark.parametrize(
    ("preset", "text", "held"),
    [
        ("intel-20way", "131072\n", 131072),
        ("intel-20way", "100000", 65536),  # rounded down to the counters' unit
        ("intel-20way", "0x30000\n", 196608),
        ("intel-20way", "0200000", 65536),  # base 0: a leading 0 is octal
        ("intel-20way", "0", 0),
        ("amd-epyc", "100\n", 64),  # AMD counts occupancy in 64-byte units
        ("intel-20way", " 65536\n", errno.EINVAL),  # kstrtouint skips no space
        ("intel-20way", "-1\n", errno.EINVAL),
        ("intel-20way", "0x\n", errno.EINVAL),
        ("intel-20way", "4294967296\n", errno.ERANGE),  # beyond an unsigned int
        ("intel-20way", f"{40 * 1024 * 1024 + 1}\n", errno.EINVAL),  # beyond the cache
    ],
)
def test_max_threshold_occupancy_is_written_as_the_kernel_takes_it(
    preset: str, text: str, held: int
) -> None:
    """max_threshold_occ_write: kstrtouint(buf, 0), at most the cache's size, kept as a
    multiple of the occupancy counter's unit; a refusal leaves the value and the status."""
    with emulated_resctrl(preset) as emu:
        path = "info/L3_MON/max_threshold_occupancy"
        before = emu.read(path)
        refused(emu, "schemata", "L3\n")  # a status left by the command before
        if held in (errno.EINVAL, errno.ERANGE):
            with pytest.raises(OSError) as err:
                emu.write(path, text)
            assert err.value.errno == held and emu.read(path) == before
        else:
            emu.write(path, text)
            assert emu.read(path) == f"{held}\n"
        assert emu.status() == "Missing ':'"


def test_under_cdp_a_new_group_avoids_an_exclusive_groups_code_and_data_masks() -> None:
    with emulated_resctrl("intel-cdp") as emu:
        emu.write("schemata", "L3CODE:0=c0000;1=c0000\nL3DATA:0=c0000;1=c0000\n")
        os.mkdir(f"{emu.root}/x")
        emu.write("x/schemata", "L3CODE:0=f;1=f\nL3DATA:0=f0;1=f0\n")
        emu.write("x/mode", "exclusive\n")
        os.mkdir(f"{emu.root}/n")
        held = parse(emu.read("n/schemata"))
        # x uses ways 0-7 between its code and data masks: the new group gets ways 8-17
        # and the shareable ones above (the hardware's and the default group's, 18-19)
        assert held.get("L3CODE", 0) == held.get("L3DATA", 0) == 0xFFF00
        emu.write("n/schemata", "L3DATA:0=fff00\n")  # its own mask is one it may keep


@pytest.mark.parametrize(
    ("text", "held"),
    [
        ("L3:0=+ff;1=+0xf0\n", "L3:0=000ff;1=000f0"),  # kstrtoull takes one leading '+'
        ("L3:0=0XfF\n", "L3:0=000ff"),
        ("MB:0=+50;1=0050\n", "MB:0=   50;1=   50"),
    ],
)
def test_numbers_are_read_as_the_kernels_kstrtoull_reads_them(emu: Emulated, text, held):
    os.mkdir(f"{emu.root}/g")
    emu.write("g/schemata", text)
    assert held in emu.read("g/schemata")


def test_a_trailing_semicolon_ends_the_line(emu: Emulated) -> None:
    os.mkdir(f"{emu.root}/g")
    emu.write("g/schemata", "L3:0=ff;1=f;\n")
    assert "L3:0=000ff;1=0000f" in emu.read("g/schemata")


def test_a_bad_line_applies_nothing_of_the_write(emu: Emulated) -> None:
    os.mkdir(f"{emu.root}/g")
    before = emu.read("g/schemata")
    assert refused(emu, "g/schemata", "L3:0=ff\nMB:0=5\n")[0] == errno.EINVAL
    assert emu.read("g/schemata") == before


def test_write_without_newline_fails_before_status_is_reset(emu: Emulated) -> None:
    os.mkdir(f"{emu.root}/g")
    refused(emu, "g/schemata", "L3:0=zz\n")
    err, status = refused(emu, "g/schemata", "L3:0=ff")
    assert err == errno.EINVAL
    assert status == "Non-hex character in the mask zz", "status belongs to the previous command"


def test_min_cbm_bits_on_haswell() -> None:
    with emulated_resctrl("e5v3-4clos") as emu:
        os.mkdir(f"{emu.root}/g")
        assert refused(emu, "g/schemata", "L3:0=1\n") == (
            errno.EINVAL,
            "Need at least 2 bits in the mask",
        )


def test_mb_rounds_up_and_readback_is_padded(emu: Emulated) -> None:
    os.mkdir(f"{emu.root}/g")
    emu.write("g/schemata", "L3:1=ff\nMB:0=15\n")
    assert emu.status() == "ok"
    text = emu.read("g/schemata")
    assert "L3:0=fffff;1=000ff\n" in text
    assert "MB:0=   20;1=  100\n" in text


def test_cdp_pads_names_and_takes_code_and_data() -> None:
    with emulated_resctrl("intel-cdp") as emu:
        assert os.path.isdir(f"{emu.root}/info/L3CODE")
        assert not os.path.exists(f"{emu.root}/info/L3")
        assert emu.read("info/L3DATA/num_closids").strip() == "8"
        os.mkdir(f"{emu.root}/g")
        emu.write("g/schemata", "L3CODE:0=3\nL3DATA:0=c\n")
        text = emu.read("g/schemata")
        assert "L3DATA:0=0000c;1=fffff" in text and "L3CODE:0=00003" in text
        assert "    MB:0=" in text
        assert refused(emu, "g/schemata", "L3:0=ff\n")[1] == (
            "Unknown or unsupported resource name 'L3'"
        )


def test_mbps_mode_takes_any_value_and_defaults_to_u32_max() -> None:
    with emulated_resctrl("intel-mbps") as emu:
        os.mkdir(f"{emu.root}/g")
        assert "4294967295" in emu.read("g/schemata")
        emu.write("g/schemata", "MB:0=12345\n")
        assert "MB:0=12345;" in emu.read("g/schemata")


@pytest.mark.parametrize(("preset", "kept"), [("intel-mbps", True), ("intel-20way", False)])
def test_a_refused_write_keeps_an_mbps_value_parsed_before(preset: str, kept: bool) -> None:
    # parse_bw stores an mba_MBps value while parsing; other values are staged and dropped.
    with emulated_resctrl(preset) as emu:
        os.mkdir(f"{emu.root}/g")
        before = parse(emu.read("g/schemata"))
        # An MB value then an empty mask (refused) in one write.
        assert refused(emu, "g/schemata", "MB:0=50\nL3:1=0\n")[0] == errno.EINVAL
        after = parse(emu.read("g/schemata"))
        assert after.get("MB", 0) == (50 if kept else before.get("MB", 0))
        assert after.resources["L3"] == before.resources["L3"]


@pytest.mark.parametrize(("preset", "stored"), [("intel-mbps", 200), ("intel-20way", None)])
def test_a_domain_named_twice_is_a_duplicate_except_under_mba_mbps(preset: str, stored) -> None:
    # parse_bw checks for a duplicate by the staged value, which mba_MBps never stages
    with emulated_resctrl(preset) as emu:
        os.mkdir(f"{emu.root}/g")
        before = parse(emu.read("g/schemata")).get("MB", 0)
        if stored is None:
            assert refused(emu, "g/schemata", "MB:0=50;0=60\n") == (
                errno.EINVAL,
                "Duplicate domain 0",
            )
            assert parse(emu.read("g/schemata")).get("MB", 0) == before
        else:
            emu.write("g/schemata", "MB:0=100;0=200\n")
            assert parse(emu.read("g/schemata")).get("MB", 0) == stored


def test_exclusive_mode_and_overlap_rules(emu: Emulated) -> None:
    os.mkdir(f"{emu.root}/a")
    os.mkdir(f"{emu.root}/b")
    # A new group overlaps the default group: exclusive mode is refused.
    assert refused(emu, "a/mode", "exclusive\n") == (errno.EINVAL, "Schemata overlaps")
    emu.write("schemata", "L3:0=000ff;1=000ff\n")  # the admin shrinks the default group
    emu.write("b/schemata", "L3:0=000ff;1=000ff\n")
    emu.write("a/schemata", "L3:0=ff000;1=ff000\n")
    # ways 18-19 are the hardware's (shareable_bits c0000): they count as another group's
    assert refused(emu, "a/mode", "exclusive\n") == (errno.EINVAL, "Schemata overlaps")
    emu.write("a/schemata", "L3:0=3f000;1=3f000\n")
    emu.write("a/mode", "exclusive\n")
    assert emu.read("a/mode") == "exclusive\n"
    assert refused(emu, "a/schemata", "L3:0=7f000\n") == (
        errno.EINVAL,
        "Overlaps with other group",
    )
    assert refused(emu, "b/schemata", "L3:0=01fff\n") == (
        errno.EINVAL,
        "Overlaps with exclusive group",
    )
    assert refused(emu, "a/schemata", "L3:0=7ff80\n") == (errno.EINVAL, "Overlaps with other group")
    assert emu.read("info/L3/bit_usage").startswith("0=HHEEEEEE0000SSSSSSSS;")
    # A new group gets every bit not held by the exclusive group.
    os.mkdir(f"{emu.root}/c")
    assert "    L3:0=00fff;1=00fff\n" in emu.read("c/schemata")
    assert refused(emu, "a/mode", "bogus\n") == (errno.EINVAL, "Unknown or unsupported mode")


@pytest.mark.parametrize("text", [" shareable\n", "shareable \n", "shareable\n\n", "\tshareable\n"])
def test_a_mode_is_one_word_and_its_newline(emu: Emulated, text: str) -> None:
    """rdtgroup_mode_write takes off the one trailing newline and compares the rest
    whole (strcmp): a space or a second newline is an unknown mode, even the one the
    group has (before, the emulator stripped white space and took them)."""
    os.mkdir(f"{emu.root}/a")
    assert refused(emu, "a/mode", text) == (errno.EINVAL, "Unknown or unsupported mode")
    assert refused(emu, "a/mode", "shareable")[0] == errno.EINVAL  # no newline at all
    emu.write("a/mode", "shareable\n")
    assert emu.status() == "ok"


def test_a_mode_ends_at_a_nul(emu: Emulated) -> None:
    """strcmp reads the written buffer as a C string: what follows a NUL is not compared."""
    os.mkdir(f"{emu.root}/a")
    emu.write("schemata", "L3:0=000ff;1=000ff\n")
    emu.write("a/schemata", "L3:0=3f000;1=3f000\n")  # so exclusive mode is possible
    emu.write("a/mode", "exclusive\0 and what follows\n")
    assert (emu.read("a/mode"), emu.status()) == ("exclusive\n", "ok")
    assert refused(emu, "a/mode", "\0shareable\n") == (errno.EINVAL, "Unknown or unsupported mode")


@pytest.mark.parametrize(
    ("preset", "status"),
    [
        ("intel-20way", "Schemata overlaps"),  # its full mask holds the shareable bits
        ("amd-epyc", None),  # no shareable bits and no other group: nothing overlaps
    ],
)
def test_the_default_group_may_be_exclusive_if_nothing_overlaps(
    preset: str, status: str | None
) -> None:
    """rdtgroup_mode_write has no rule of its own for the default group: the overlap
    test decides, and a new group then finds no ways left (AMD's min_cbm_bits is 0, so
    it is made with an empty mask)."""
    with emulated_resctrl(preset) as emu:
        if status is not None:
            assert refused(emu, "mode", "exclusive\n") == (errno.EINVAL, status)
            assert emu.read("mode") == "shareable\n"
            return
        emu.write("mode", "exclusive\n")
        assert (emu.read("mode"), emu.status()) == ("exclusive\n", "ok")
        os.mkdir(f"{emu.root}/a")
        assert "L3:0=0000;1=0000;" in emu.read("a/schemata")


def test_tasks_move_and_rmdir_returns_them(emu: Emulated, child: int) -> None:
    os.mkdir(f"{emu.root}/a")
    os.mkdir(f"{emu.root}/b")
    emu.write("a/tasks", f"{child}\n")
    assert emu.read("a/tasks") == f"{child}\n"
    assert str(child) not in emu.read("tasks").split()
    emu.write("b/tasks", f"{child}\n")  # a move, not an overwrite of a's file
    assert emu.read("a/tasks") == ""
    assert emu.read("b/tasks") == f"{child}\n"
    emu.write("b/cpus_list", "2-3\n")
    assert emu.read("b/cpus") == "00c\n"
    assert emu.read("cpus_list") == "0-1,4-7\n"
    os.rmdir(f"{emu.root}/b")
    assert str(child) in emu.read("tasks").split()
    assert emu.read("cpus_list") == "0-7\n"


@pytest.mark.parametrize(
    ("rel", "text", "err", "status"),
    [
        # rdtgroup_cpus_write passes the bitmap parser's errno through
        ("a/cpus_list", "0-99\n", errno.ERANGE, "Bad CPU list/mask"),
        ("a/cpus_list", "9\n", errno.EINVAL, "Can only assign online CPUs"),  # offline
        ("a/cpus", "zz\n", errno.EINVAL, "Bad CPU list/mask"),
        ("a/cpus", "1000\n", errno.EOVERFLOW, "Bad CPU list/mask"),  # CPU 12 not possible
        ("cpus_list", "0-3\n", errno.EINVAL, "Can't drop CPUs from default group"),
    ],
)
def test_cpu_errors(emu: Emulated, rel: str, text: str, err: int, status: str) -> None:
    os.mkdir(f"{emu.root}/a")
    assert refused(emu, rel, text) == (err, status)


def test_mon_groups_and_task_rules(emu: Emulated, child: int) -> None:
    os.mkdir(f"{emu.root}/a")
    os.mkdir(f"{emu.root}/a/mon_groups/m")
    assert refused(emu, "a/mon_groups/m/tasks", f"{child}\n") == (
        errno.EINVAL,
        "Can't move task to different control group",
    )
    emu.write("a/tasks", f"{child}\n")
    emu.write("a/mon_groups/m/tasks", f"{child}\n")
    assert emu.read("a/tasks") == f"{child}\n", "a control group lists its mon groups' tasks"
    with pytest.raises(PermissionError):
        os.mkdir(f"{emu.root}/a/nested")
    os.rmdir(f"{emu.root}/a")
    assert str(child) in emu.read("tasks").split()


def test_closid_exhaustion() -> None:
    with emulated_resctrl("e5v3-4clos") as emu:
        for i in range(3):  # the default group holds CLOSID 0
            os.mkdir(f"{emu.root}/g{i}")
        with pytest.raises(OSError) as err:
            os.mkdir(f"{emu.root}/g3")
        assert (err.value.errno, emu.status()) == (errno.ENOSPC, "Out of CLOSIDs")
        assert not os.path.exists(f"{emu.root}/g3")


def test_rmid_exhaustion_and_limbo() -> None:
    with emulated_resctrl("intel-20way", num_rmids=4, limbo_s=0.3) as emu:
        os.mkdir(f"{emu.root}/a")
        os.mkdir(f"{emu.root}/a/mon_groups/m1")
        os.mkdir(f"{emu.root}/a/mon_groups/m2")
        with pytest.raises(OSError) as err:
            os.mkdir(f"{emu.root}/a/mon_groups/m3")
        assert (err.value.errno, emu.status()) == (errno.ENOSPC, "Out of RMIDs")
        os.rmdir(f"{emu.root}/a/mon_groups/m2")
        with pytest.raises(OSError) as err:
            os.mkdir(f"{emu.root}/b")
        assert (err.value.errno, emu.status()) == (errno.EBUSY, "Out of RMIDs")
        time.sleep(0.35)
        os.mkdir(f"{emu.root}/b")


def test_counters_grow_with_tasks_and_occupancy_follows_the_mask(emu: Emulated, child: int) -> None:
    os.mkdir(f"{emu.root}/a")
    total = "a/mon_data/mon_L3_00/mbm_total_bytes"
    occ = "a/mon_data/mon_L3_00/llc_occupancy"
    assert emu.read(total) == "0\n"
    emu.write("a/tasks", f"{child}\n")
    first = int(emu.read(total))
    time.sleep(0.05)
    second = int(emu.read(total))
    assert second > first
    assert int(emu.read("a/mon_data/mon_L3_00/mbm_local_bytes")) < second
    full = int(emu.read(occ))
    emu.write("a/schemata", "L3:0=1\n")
    assert 0 < int(emu.read(occ)) < full


def test_counter_injection_and_reset(emu: Emulated, child: int) -> None:
    os.mkdir(f"{emu.root}/a")
    emu.write("a/tasks", f"{child}\n")
    time.sleep(0.02)
    path = "a/mon_data/mon_L3_01/mbm_total_bytes"
    assert int(emu.read(path)) > 0
    emu.model.set_counter("a", "mbm_total_bytes", "Unavailable", domain=1)
    assert emu.read(path) == "Unavailable\n"
    emu.model.set_counter("a", "mbm_total_bytes", None, domain=1)
    emu.model.reset_counters("a")
    assert int(emu.read(path)) < 10**6


def test_injected_write_failure(emu: Emulated) -> None:
    os.mkdir(f"{emu.root}/a")
    emu.model.fail_next_write("a/schemata", errno.EIO, "injected")
    assert refused(emu, "a/schemata", "L3:0=ff\n") == (errno.EIO, "injected")
    emu.write("a/schemata", "L3:0=ff\n")  # one-shot


def test_info_files(emu: Emulated) -> None:
    assert emu.read("info/L3/cbm_mask") == "fffff\n"
    assert emu.read("info/L3/shareable_bits") == "c0000\n"
    assert emu.read("info/MB/num_closids") == "8\n"
    assert emu.read("info/L3_MON/mon_features").split() == [
        "llc_occupancy",
        "mbm_total_bytes",
        "mbm_local_bytes",
    ]
    assert sorted(os.listdir(f"{emu.root}/mon_data")) == ["mon_L3_00", "mon_L3_01"]
    with pytest.raises(OSError):
        emu.write("info/L3/cbm_mask", "ff\n")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_consistent(name: str) -> None:
    p = get_preset(name)
    m = Model(p)
    assert m.num_closids >= 2
    assert p.cpus_possible >= p.cpus_online
    assert p.shareable_bits & ~p.cbm_mask == 0
    if p.mb is not None:
        assert p.mb.min_bandwidth <= p.mb.max_bandwidth
    assert m.read("/schemata").count("\n") == len(m.schemas)


def test_unknown_preset_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        get_preset("nope")


def test_a_write_longer_than_a_page_is_e2big_and_keeps_the_status(emu: Emulated) -> None:
    """kernfs_fop_write_iter refuses a write beyond atomic_write_len (PAGE_SIZE) before any
    handler runs: a long cpus_list or pid list passed here and failed on a real host."""
    os.mkdir(f"{emu.root}/g")
    with pytest.raises(OSError) as err:
        emu.write("g/schemata", "L3:0=zz\n")
    before = emu.status()
    with pytest.raises(OSError) as err:
        emu.write("g/cpus_list", "0" + ",0" * 2500 + "\n")  # 5,002 bytes
    assert err.value.errno == errno.E2BIG
    assert emu.status() == before


def test_rmdir_leaves_the_last_status_alone(emu: Emulated) -> None:
    # rdtgroup_rmdir never calls rdt_last_cmd_clear (mkdir does)
    os.mkdir(f"{emu.root}/g")
    with pytest.raises(OSError):
        emu.write("g/schemata", "L3:0=zz\n")
    before = emu.status()
    os.rmdir(f"{emu.root}/g")
    assert emu.status() == before != "ok"


@pytest.mark.parametrize(("preset", "present"), [("intel-20way", False), ("amd-epyc", True)])
def test_sparse_masks_is_listed_from_kernel_6_7(preset: str, present: bool) -> None:
    # the 20-way preset runs 6.1, the EPYC one 6.8 (4dba8f10b8fe came in 6.7)
    with emulated_resctrl(preset) as emu:
        assert os.path.exists(f"{emu.root}/info/L3/sparse_masks") is present


def test_amd_mba_is_not_linear_and_has_no_throttle_mode() -> None:
    # __rdt_get_mem_config_amd: delay_linear false, THREAD_THROTTLE_UNDEFINED (no file)
    with emulated_resctrl("amd-epyc") as emu:
        assert emu.read("info/MB/delay_linear").strip() == "0"
        assert not os.path.exists(f"{emu.root}/info/MB/thread_throttle_mode")


@pytest.mark.parametrize(
    ("line", "ok"),
    [
        ("L3:+0=f\n", True),  # kstrtoul takes a leading '+'
        ("L3:\u0661=f\n", False),  # an Arabic-Indic one: str.isdigit's, not the kernel's
        ("L3:\u00b2=f\n", False),  # a superscript two: a traceback in the emulator before
        ("L3:99999999999999999999999=f\n", False),  # beyond an unsigned long
    ],
)
def test_domain_ids_are_read_as_kstrtoul_reads_them(emu: Emulated, line: str, ok: bool) -> None:
    os.mkdir(f"{emu.root}/g")
    if ok:
        emu.write("g/schemata", line)
        assert emu.status() == "ok"
        return
    with pytest.raises(OSError) as err:
        emu.write("g/schemata", line)
    assert err.value.errno == errno.EINVAL
    assert emu.status() == "Missing '=' or non-numeric domain"


def test_a_schemata_write_ends_at_its_first_nul(emu: Emulated) -> None:
    # rdtgroup_schemata_write parses the buffer as a C string: "junk" past the NUL is unseen
    os.mkdir(f"{emu.root}/g")
    emu.write("g/schemata", "L3:0=f\0junk\n")
    assert emu.status() == "ok"
    assert "L3:0=0000f" in emu.read("g/schemata").replace(" ", "")

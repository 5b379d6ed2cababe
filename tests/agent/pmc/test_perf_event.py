"""The perf_event_open ABI: struct layout, the real syscall (E2BIG retry included),
ioctls and the read-format parsers."""

from __future__ import annotations

import ctypes
import errno
import os
import struct

import pytest

from agent.pmc import perf_event as pe
from agent.pmc.events import EVENTS
from tests.agent.pmc.workload import burn

TASK_CLOCK = EVENTS["task_clock"]


def task_clock_attr(**kw) -> pe.perf_event_attr:
    return pe.make_attr(TASK_CLOCK.type, TASK_CLOCK.config, read_format=pe.SINGLE_READ_FORMAT, **kw)


@pytest.mark.parametrize(
    ("field", "offset"),
    [  # offsets in linux/perf_event.h (x86_64 and aarch64 share them)
        ("type", 0),
        ("size", 4),
        ("config", 8),
        ("sample_period", 16),
        ("read_format", 32),
        ("flags", 40),
        ("wakeup_events", 48),
        ("config1", 56),
        ("config2", 64),
        ("branch_sample_type", 72),
        ("sample_stack_user", 88),
        ("clockid", 92),
        ("sample_regs_intr", 96),
        ("aux_watermark", 104),
        ("sample_max_stack", 108),
        ("aux_sample_size", 112),
        ("aux_action", 116),
        ("sig_data", 120),
        ("config3", 128),
    ],
)
def test_attr_layout_matches_the_header(field, offset):
    assert getattr(pe.perf_event_attr, field).offset == offset
    assert ctypes.sizeof(pe.perf_event_attr) == 136 == pe.PERF_ATTR_SIZE_VER8


def test_syscall_numbers():
    assert pe.syscall_number("x86_64") == 298
    assert pe.syscall_number("aarch64") == 241
    with pytest.raises(OSError, match="unsupported architecture 'mips'"):
        pe.syscall_number("mips")


def read_value(fd: int) -> int:
    return pe.read_single(fd).values[pe.event_id(fd)]


def test_real_syscall_counts_this_thread():
    fd = pe.perf_event_open(task_clock_attr(flags=pe.ATTR_DISABLED), 0, -1)
    try:
        assert read_value(fd) == 0  # opened disabled
        pe.enable(fd)
        used = burn(0.02)
        pe.disable(fd)
        counted = read_value(fd)
        assert counted >= 0.8 * used * 1e9
        burn(0.01)
        assert read_value(fd) == counted  # disabled: nothing more counted
        pe.reset(fd)
        assert read_value(fd) == 0
    finally:
        os.close(fd)


def test_e2big_size_below_ver0_is_retried_with_the_kernels_size():
    attr = task_clock_attr()
    attr.size = 8
    fd, err = pe._raw_open(ctypes.addressof(attr), 0, -1, -1, pe.PERF_FLAG_FD_CLOEXEC)
    assert (fd, err) == (-1, errno.E2BIG)
    kernel_size = attr.size
    assert kernel_size >= pe.PERF_ATTR_SIZE_VER0  # written back by the kernel

    attr.size = 8
    fd = pe.perf_event_open(attr, 0, -1)
    os.close(fd)
    assert attr.size == kernel_size


def test_e2big_from_an_older_kernel_is_retried_with_the_smaller_size():
    # Pretend our layout is newer than the kernel's: a 144-byte attr whose tail is not zero.
    buf = (ctypes.c_char * 144)()
    attr = task_clock_attr()
    ctypes.memmove(buf, ctypes.addressof(attr), 136)
    ctypes.c_uint32.from_address(ctypes.addressof(buf) + 4).value = 144
    buf[140] = b"\x01"
    size = ctypes.c_uint32.from_address(ctypes.addressof(buf) + 4)
    fd, err = pe._raw_open(ctypes.addressof(buf), 0, -1, -1, pe.PERF_FLAG_FD_CLOEXEC)
    assert (fd, err) == (-1, errno.E2BIG)
    assert pe.PERF_ATTR_SIZE_VER0 <= size.value < 144  # the kernel wrote back its size

    size.value = 144
    fd = pe.perf_event_open(buf, 0, -1)
    os.close(fd)


def test_e2big_asking_for_more_than_the_buffer_gets_a_padded_copy():
    # A VER0-sized buffer (an old binary) that the kernel answers with its larger size.
    buf = (ctypes.c_char * pe.PERF_ATTR_SIZE_VER0)()
    attr = task_clock_attr()
    ctypes.memmove(buf, ctypes.addressof(attr), pe.PERF_ATTR_SIZE_VER0)
    size = ctypes.c_uint32.from_address(ctypes.addressof(buf) + 4)
    size.value = 8
    fd, err = pe._raw_open(ctypes.addressof(buf), 0, -1, -1, pe.PERF_FLAG_FD_CLOEXEC)
    assert (fd, err) == (-1, errno.E2BIG) and size.value > len(buf)

    size.value = 8
    fd = pe.perf_event_open(buf, 0, -1)
    os.close(fd)


def test_open_errors_carry_the_kernels_errno():
    with pytest.raises(OSError) as info:
        pe.perf_event_open(pe.make_attr(pe.PERF_TYPE_SOFTWARE, 10_000), 0, -1)
    assert info.value.errno in (errno.ENOENT, errno.EINVAL)


def group_buffer(enabled: int, running: int, pairs: list[tuple[int, int]]) -> bytes:
    flat = [x for value, id_ in pairs for x in (value, id_)]
    return struct.pack(f"=3Q{len(flat)}Q", len(pairs), enabled, running, *flat)


def test_parse_group_read_maps_values_by_id():
    raw = pe.parse_group_read(group_buffer(1000, 250, [(7, 42), (9, 3), (11, 17)]))
    assert raw.values == {42: 7, 3: 9, 17: 11}
    assert (raw.time_enabled, raw.time_running) == (1000, 250)


@pytest.mark.parametrize("cut", [0, 16, 24 + 8, 24 + 16 * 3 - 1])
def test_parse_group_read_rejects_short_buffers(cut):
    with pytest.raises(ValueError, match="bytes"):
        pe.parse_group_read(group_buffer(1, 1, [(1, 1), (2, 2), (3, 3)])[:cut])


def test_parse_single_read():
    raw = pe.parse_single_read(struct.pack("=4Q", 5, 100, 50, 77))
    assert raw.values == {77: 5} and (raw.time_enabled, raw.time_running) == (100, 50)
    with pytest.raises(ValueError):
        pe.parse_single_read(b"\0" * 31)

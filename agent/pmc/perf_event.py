"""The perf_event_open ABI through ctypes: ``perf_event_attr``, constants, the raw syscall,
the ioctls and the read formats.

Implements docs/RESCTRL.md, "perf_event_open": no maintained PyPI binding does
cgroup-scoped counting, so this module speaks the kernel ABI of ``linux/perf_event.h``
directly. Nothing here knows about event names or groups (see ``events`` and ``counters``).
"""

from __future__ import annotations

import ctypes
import errno as _errno
import fcntl
import os
import platform
import struct
from dataclasses import dataclass

# --------------------------------------------------------------------------- constants

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1

# perf_event_attr.read_format
PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
PERF_FORMAT_ID = 1 << 2
PERF_FORMAT_GROUP = 1 << 3

# perf_event_attr flag bits (the bitfield word after read_format)
ATTR_DISABLED = 1 << 0
ATTR_INHERIT = 1 << 1
ATTR_PINNED = 1 << 2
ATTR_EXCLUSIVE = 1 << 3
ATTR_EXCLUDE_USER = 1 << 4
ATTR_EXCLUDE_KERNEL = 1 << 5
ATTR_EXCLUDE_HV = 1 << 6
ATTR_EXCLUDE_IDLE = 1 << 7

# perf_event_open flags
PERF_FLAG_FD_NO_GROUP = 1 << 0
PERF_FLAG_FD_OUTPUT = 1 << 1
PERF_FLAG_PID_CGROUP = 1 << 2
PERF_FLAG_FD_CLOEXEC = 1 << 3

# ioctls: _IO('$', n) and _IOR('$', 7, __u64 *)
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_RESET = 0x2403
PERF_EVENT_IOC_ID = 0x80082407
PERF_IOC_FLAG_GROUP = 1

# Published sizes of perf_event_attr (PERF_ATTR_SIZE_VER0 .. VER8).
PERF_ATTR_SIZE_VER0 = 64
PERF_ATTR_SIZE_VER8 = 136

SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241, "arm64": 241}


class perf_event_attr(ctypes.Structure):
    """``struct perf_event_attr`` in its latest layout (PERF_ATTR_SIZE_VER8, 136 bytes).

    The bitfield word is one ``flags`` integer (``ATTR_*`` bits) rather than ctypes
    bitfields, so its layout does not depend on the compiler's bitfield ordering; unions
    are represented by their first member.
    """

    _fields_ = (
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),  # union with sample_freq
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),  # disabled:1, inherit:1, pinned:1, ...
        ("wakeup_events", ctypes.c_uint32),  # union with wakeup_watermark
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),  # union with bp_addr, kprobe_func, uprobe_path
        ("config2", ctypes.c_uint64),  # union with bp_len, kprobe_addr, probe_offset
        ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32),
        ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64),
        ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16),
        ("_reserved_2", ctypes.c_uint16),
        ("aux_sample_size", ctypes.c_uint32),
        ("aux_action", ctypes.c_uint32),
        ("sig_data", ctypes.c_uint64),
        ("config3", ctypes.c_uint64),
    )


assert ctypes.sizeof(perf_event_attr) == PERF_ATTR_SIZE_VER8


def make_attr(type_: int, config: int, *, read_format: int = 0, flags: int = 0) -> perf_event_attr:
    """A counting (non-sampling) attr of the latest size."""
    attr = perf_event_attr()
    attr.type = type_
    attr.size = ctypes.sizeof(perf_event_attr)
    attr.config = config
    attr.read_format = read_format
    attr.flags = flags
    return attr


# --------------------------------------------------------------------------- syscall


def syscall_number(machine: str | None = None) -> int:
    machine = machine or platform.machine()
    try:
        return SYS_PERF_EVENT_OPEN[machine]
    except KeyError:
        raise OSError(
            _errno.ENOSYS,
            f"perf_event_open: unsupported architecture {machine!r} "
            f"(known: {', '.join(sorted(SYS_PERF_EVENT_OPEN))})",
        ) from None


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _raw_open(attr_ptr: int, pid: int, cpu: int, group_fd: int, flags: int) -> tuple[int, int]:
    """One syscall; returns (fd or -1, errno)."""
    ctypes.set_errno(0)
    fd = _syscall(
        ctypes.c_long(syscall_number()),
        ctypes.c_void_p(attr_ptr),
        ctypes.c_long(pid),
        ctypes.c_long(cpu),
        ctypes.c_long(group_fd),
        ctypes.c_ulong(flags),
    )
    return fd, (ctypes.get_errno() if fd < 0 else 0)


def perf_event_open(
    attr: perf_event_attr | ctypes.Array,
    pid: int,
    cpu: int,
    group_fd: int = -1,
    flags: int = PERF_FLAG_FD_CLOEXEC,
) -> int:
    """Open one event; returns its fd or raises ``OSError`` with the kernel's errno.

    On E2BIG the kernel writes the size it wants into ``attr.size``: below
    PERF_ATTR_SIZE_VER0, or larger than it knows with non-zero bytes past its size (an
    older kernel). Retry once with that size; ``attr`` may also be a larger raw buffer
    (``ctypes.c_char * n``) whose first bytes are the attr.
    """
    ptr = ctypes.addressof(attr)
    capacity = ctypes.sizeof(attr)
    size_field = ctypes.c_uint32.from_address(ptr + perf_event_attr.size.offset)
    fd, err = _raw_open(ptr, pid, cpu, group_fd, flags)
    if fd < 0 and err == _errno.E2BIG:
        wanted = size_field.value
        if wanted > capacity:
            # A newer kernel than this layout: hand it a zero-padded copy of the size it wants.
            bigger = (ctypes.c_char * wanted)()
            ctypes.memmove(bigger, ptr, capacity)
            ctypes.c_uint32.from_address(ctypes.addressof(bigger) + 4).value = wanted
            fd, err = _raw_open(ctypes.addressof(bigger), pid, cpu, group_fd, flags)
        elif wanted >= PERF_ATTR_SIZE_VER0:
            fd, err = _raw_open(ptr, pid, cpu, group_fd, flags)
    if fd < 0:
        raise OSError(err, os.strerror(err))
    return fd


def ioctl(fd: int, request: int, arg: int = 0) -> None:
    fcntl.ioctl(fd, request, arg)


def enable(fd: int, group: bool = True) -> None:
    ioctl(fd, PERF_EVENT_IOC_ENABLE, PERF_IOC_FLAG_GROUP if group else 0)


def disable(fd: int, group: bool = True) -> None:
    ioctl(fd, PERF_EVENT_IOC_DISABLE, PERF_IOC_FLAG_GROUP if group else 0)


def reset(fd: int, group: bool = True) -> None:
    ioctl(fd, PERF_EVENT_IOC_RESET, PERF_IOC_FLAG_GROUP if group else 0)


def event_id(fd: int) -> int:
    """The kernel's unique id of an event (PERF_EVENT_IOC_ID), as reported by ID reads."""
    buf = bytearray(8)
    fcntl.ioctl(fd, PERF_EVENT_IOC_ID, buf, True)
    return struct.unpack("=Q", buf)[0]


# --------------------------------------------------------------------------- reads

GROUP_READ_FORMAT = (
    PERF_FORMAT_GROUP
    | PERF_FORMAT_TOTAL_TIME_ENABLED
    | PERF_FORMAT_TOTAL_TIME_RUNNING
    | PERF_FORMAT_ID
)
SINGLE_READ_FORMAT = (
    PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING | PERF_FORMAT_ID
)


@dataclass(frozen=True, slots=True)
class RawRead:
    """One group's counts: event id -> raw value, with the group's enabled/running ns."""

    values: dict[int, int]
    time_enabled: int
    time_running: int


def group_read_size(nr: int) -> int:
    return 8 * (3 + 2 * nr)


def parse_group_read(buf: bytes) -> RawRead:
    """Parse a PERF_FORMAT_GROUP|TOTAL_TIME_ENABLED|TOTAL_TIME_RUNNING|ID buffer:
    ``u64 nr, time_enabled, time_running; {u64 value, id} x nr``."""
    if len(buf) < 24:
        raise ValueError(f"group read buffer of {len(buf)} bytes is shorter than its header")
    nr, enabled, running = struct.unpack_from("=QQQ", buf, 0)
    if len(buf) < group_read_size(nr):
        raise ValueError(
            f"group read of {nr} events needs {group_read_size(nr)} bytes, got {len(buf)}"
        )
    pairs = struct.unpack_from(f"={2 * nr}Q", buf, 24)
    values = {pairs[i + 1]: pairs[i] for i in range(0, 2 * nr, 2)}
    return RawRead(values, enabled, running)


def parse_single_read(buf: bytes) -> RawRead:
    """Parse a TOTAL_TIME_ENABLED|TOTAL_TIME_RUNNING|ID buffer: ``value, enabled, running, id``."""
    if len(buf) < 32:
        raise ValueError(f"single read buffer of {len(buf)} bytes, need 32")
    value, enabled, running, id_ = struct.unpack_from("=QQQQ", buf, 0)
    return RawRead({id_: value}, enabled, running)


def read_group(fd: int, nr: int) -> RawRead:
    return parse_group_read(os.read(fd, group_read_size(nr)))


def read_single(fd: int) -> RawRead:
    return parse_single_read(os.read(fd, 32))

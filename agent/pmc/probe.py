"""What works here: open each counter event once on the calling process and say why the
ones that fail do (docs/RESCTRL.md, "perf_event_open": without a PMU hardware events fail
with ENOENT, also EOPNOTSUPP, ENODEV, ENXIO, EINVAL). Fills
``NodeCapabilities.pmc_events`` / ``pmc_unsupported``."""

from __future__ import annotations

import os
from collections.abc import Iterable

from agent.pmc import perf_event as pe
from agent.pmc.errors import reason
from agent.pmc.events import HARDWARE_EVENTS, lookup

CPUINFO = "/proc/cpuinfo"
LLC_EVENTS = frozenset({"llc_references", "llc_misses"})


def _cpuinfo_field(text: str, key: str) -> str:
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == key:
            return value.strip()
    return ""


def llc_mismatch(cpuinfo: str = CPUINFO, machine: str | None = None) -> str | None:
    """Why the generic cache-references/cache-misses events are not last-level cache
    events on this CPU, or None where they are (Intel: LONGEST_LAT_CACHE 0x4f2e/0x412e).
    The kernel maps them per vendor: counted under the llc_* names, other caches' misses
    would reach the policy as LLC misses."""
    machine = machine or os.uname().machine
    if machine.startswith(("aarch64", "arm")):
        return (
            "not last-level cache on Arm: the kernel maps cache-references/cache-misses "
            "to L1D_CACHE/L1D_CACHE_REFILL"
        )
    try:
        with open(cpuinfo) as f:
            vendor = _cpuinfo_field(f.read(), "vendor_id")
    except OSError:
        return None
    if vendor in ("AuthenticAMD", "HygonGenuine"):
        return (
            "not last-level cache on AMD: the kernel maps cache-references/cache-misses "
            "to L2 events (Zen: 0xff60/0x0964); L3 is counted only CPU-wide per CCX by "
            "the amd_l3 PMU"
        )
    return None


def probe_events(
    names: Iterable[str] = HARDWARE_EVENTS,
    *,
    cpuinfo: str = CPUINFO,
    machine: str | None = None,
) -> tuple[frozenset[str], dict[str, str]]:
    """(supported, unsupported): each event opened once, disabled, on this process.

    ``unsupported`` maps an event to a reason such as
    ``"ENOENT: no hardware PMU on this machine, or the PMU lacks this event"``, or, for
    the llc_* events on a CPU where they count another cache, :func:`llc_mismatch`'s.
    Never raises for an event that fails; unknown names raise ValueError.
    """
    supported: set[str] = set()
    unsupported: dict[str, str] = {}
    specs = lookup(tuple(names))
    mismatch = llc_mismatch(cpuinfo, machine) if LLC_EVENTS & {s.name for s in specs} else None
    for spec in specs:
        if mismatch and spec.name in LLC_EVENTS:
            unsupported[spec.name] = mismatch
            continue
        attr = pe.make_attr(
            spec.type, spec.config, read_format=pe.SINGLE_READ_FORMAT, flags=pe.ATTR_DISABLED
        )
        try:
            fd = pe.perf_event_open(attr, 0, -1)
        except OSError as exc:
            unsupported[spec.name] = reason(exc.errno or 0)
        else:
            os.close(fd)
            supported.add(spec.name)
    return frozenset(supported), unsupported

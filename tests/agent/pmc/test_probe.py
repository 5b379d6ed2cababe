"""probe_events: which counter events open here, and why the others do not."""

from __future__ import annotations

import errno
import glob
import os

import pytest

from agent.pmc import EVENTS, HARDWARE_EVENTS, SOFTWARE_EVENTS, probe_events
from agent.pmc.errors import reason
from agent.pmc.probe import LLC_EVENTS, llc_mismatch
from agent.types import NodeCapabilities, Vendor

NO_EVENT_ERRNOS = ("ENOENT", "EOPNOTSUPP", "ENODEV", "ENXIO", "EINVAL")


def has_cpu_pmu() -> bool:
    """Whether the kernel registered a core PMU (x86 ``cpu``/``cpu_core``, arm ``armv8*``)."""
    devices = "/sys/bus/event_source/devices"
    names = ("cpu", "cpu_core", "cpu_atom")
    return any(os.path.exists(f"{devices}/{n}") for n in names) or bool(
        glob.glob(f"{devices}/armv*")
    )


def test_software_events_are_supported():
    supported, unsupported = probe_events(SOFTWARE_EVENTS)
    assert supported == frozenset(SOFTWARE_EVENTS) and unsupported == {}


def test_hardware_events_supported_or_explained():
    supported, unsupported = probe_events()  # the hardware set by default
    assert supported | set(unsupported) == set(HARDWARE_EVENTS)
    assert not supported & set(unsupported)
    for name, why in unsupported.items():
        vendor = name in LLC_EVENTS and why == llc_mismatch()  # AMD or Arm: another cache
        assert vendor or why.split(":")[0] in NO_EVENT_ERRNOS, why


@pytest.mark.skipif(has_cpu_pmu(), reason="this machine has a core PMU")
def test_without_a_pmu_every_hardware_event_is_enoent():
    supported, unsupported = probe_events(list(EVENTS))
    assert supported == frozenset(SOFTWARE_EVENTS)
    enoent = "ENOENT: no hardware PMU on this machine, or the PMU lacks this event"
    # on AMD or Arm the llc_* events are refused before any open, for counting another cache
    assert unsupported == {
        e: (e in LLC_EVENTS and llc_mismatch()) or enoent for e in HARDWARE_EVENTS
    }


def test_probe_fills_node_capabilities():
    supported, unsupported = probe_events()
    caps = NodeCapabilities(
        vendor=Vendor.INTEL,
        num_cpus=os.cpu_count() or 1,
        pmc_events=supported,
        pmc_unsupported=unsupported,
    )
    assert caps.pmc_events == supported and dict(caps.pmc_unsupported) == unsupported


def test_probe_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown PMC event"):
        probe_events(["instructions", "flops"])


@pytest.mark.parametrize(
    ("err", "start"),
    [
        (errno.ENOENT, "ENOENT: no hardware PMU"),
        (errno.EOPNOTSUPP, "EOPNOTSUPP: the PMU does not support"),
        (errno.ENODEV, "ENODEV: no PMU device"),
        (errno.ENXIO, "ENXIO: no PMU for this event"),
        (errno.EINVAL, "EINVAL: the kernel rejected"),
        (errno.EACCES, "EACCES: not permitted (perf_event_paranoid is"),
        (errno.EPERM, "EPERM: not permitted"),
        (errno.EBUSY, "EBUSY: Device or resource busy"),
    ],
)
def test_reason_strings(err, start):
    assert reason(err).startswith(start)


@pytest.mark.parametrize(
    ("vendor", "machine", "said"),
    [
        ("AuthenticAMD", "x86_64", "not last-level cache on AMD"),
        ("HygonGenuine", "x86_64", "not last-level cache on AMD"),
        ("", "aarch64", "not last-level cache on Arm"),
        ("GenuineIntel", "x86_64", None),  # LONGEST_LAT_CACHE: probed like any event
    ],
)
def test_llc_events_are_unsupported_where_they_count_another_cache(tmp_path, vendor, machine, said):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: 25\n")
    events = ("llc_references", "llc_misses", "task_clock")
    supported, unsupported = probe_events(events, cpuinfo=str(cpuinfo), machine=machine)
    assert "task_clock" in supported
    if said is None:
        assert not any("last-level" in why for why in unsupported.values())
    else:
        assert set(unsupported) == {"llc_references", "llc_misses"}
        assert all(why.startswith(said) for why in unsupported.values())

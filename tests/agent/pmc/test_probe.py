"""probe_events: which counter events open here, and why the others do not."""

from __future__ import annotations

import errno
import glob
import os

import pytest

from agent.pmc import EVENTS, HARDWARE_EVENTS, SOFTWARE_EVENTS, probe_events
from agent.pmc.errors import reason
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
    for why in unsupported.values():
        assert why.split(":")[0] in NO_EVENT_ERRNOS, why


@pytest.mark.skipif(has_cpu_pmu(), reason="this machine has a core PMU")
def test_without_a_pmu_every_hardware_event_is_enoent():
    supported, unsupported = probe_events(list(EVENTS))
    assert supported == frozenset(SOFTWARE_EVENTS)
    assert unsupported == dict.fromkeys(
        HARDWARE_EVENTS, "ENOENT: no hardware PMU on this machine, or the PMU lacks this event"
    )


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

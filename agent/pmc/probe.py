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


def probe_events(
    names: Iterable[str] = HARDWARE_EVENTS,
) -> tuple[frozenset[str], dict[str, str]]:
    """(supported, unsupported): each event opened once, disabled, on this process.

    ``unsupported`` maps an event to a reason such as
    ``"ENOENT: no hardware PMU on this machine, or the PMU lacks this event"``.
    Never raises for an event that fails; unknown names raise ValueError.
    """
    supported: set[str] = set()
    unsupported: dict[str, str] = {}
    for spec in lookup(tuple(names)):
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

"""resctrl monitoring: ``mon_data/mon_L3_XX/{llc_occupancy,mbm_total_bytes,mbm_local_bytes}``
turned into per-interval values (docs/RESCTRL.md, "Layout" and "Behaviour").

Counter files read as a decimal byte count or as ``Unavailable``/``Error``/``Unassigned``;
those reads succeed and mean "no value" (None). ``mbm_*`` are cumulative 64-bit counters
since group creation: the per-interval value is the delta. A drop is no interval's bytes:
a reset (an RMID or domain back from offline) and a monitoring group removed under the
group (the kernel sums the control group's RMID and its monitoring groups') both lower the
value, and the value after either is not what moved in the interval (after a removal it is
the group's lifetime bytes), so such an interval reads None and the next counts from the
new value. ``llc_occupancy`` is a gauge.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from agent.resctrl.discovery import read_text

MBM_EVENTS = ("mbm_total_bytes", "mbm_local_bytes")
OCCUPANCY = "llc_occupancy"


def read_counter(path: str) -> int | None:
    """A monitoring file's value, or None for Unavailable/Error/Unassigned/missing."""
    try:
        text = read_text(path).strip()
    except FileNotFoundError:
        return None
    except OSError:
        # Some kernels return EIO for an RMID whose value is not available yet.
        return None
    return int(text) if text.isdigit() else None


def mon_domains(mon_data: str) -> list[tuple[int, str]]:
    """(domain id, directory) of every L3 monitoring domain under ``mon_data``."""
    out = []
    try:
        names = os.listdir(mon_data)
    except OSError:
        return []
    for name in names:
        if name.startswith("mon_L3_") and name[len("mon_L3_") :].isdigit():
            out.append((int(name[len("mon_L3_") :]), os.path.join(mon_data, name)))
    return sorted(out)


@dataclass
class CounterTracker:
    """Deltas of cumulative counters keyed by (group, event, domain); a drop gives None."""

    last: dict[tuple[str, str, int], int] = field(default_factory=dict)

    def delta(self, key: tuple[str, str, int], value: int | None) -> int | None:
        if value is None:
            return None  # keep the previous value: the next good read spans both intervals
        before = self.last.get(key)
        self.last[key] = value
        if before is None:
            return None  # first sight: no interval yet
        if value < before:
            return None  # a reset or a removed monitoring group (module docstring)
        return value - before

    def forget(self, group: str) -> None:
        for key in [k for k in self.last if k[0] == group]:
            del self.last[key]


@dataclass(frozen=True)
class MonSample:
    occupancy: float | None
    total: float | None
    local: float | None


def sample_group(
    name: str,
    mon_data: str,
    features: frozenset[str],
    tracker: CounterTracker,
    domains: tuple[int, ...] | None = None,
) -> MonSample:
    """One interval of ``name``'s counters, summed over domains (``domains`` when known,
    else listed from ``mon_data``).

    A sum is None only when no domain gave a value (a partially available group still
    reports what was measured).
    """
    occ: int | None = None
    sums: dict[str, int | None] = {e: None for e in MBM_EVENTS}
    if domains is None:
        where = mon_domains(mon_data)
    else:
        where = [(d, os.path.join(mon_data, f"mon_L3_{d:02d}")) for d in domains]
    for dom, path in where:
        if OCCUPANCY in features:
            v = read_counter(os.path.join(path, OCCUPANCY))
            if v is not None:
                occ = (occ or 0) + v
        for event in MBM_EVENTS:
            if event not in features:
                continue
            d = tracker.delta((name, event, dom), read_counter(os.path.join(path, event)))
            if d is not None:
                sums[event] = (sums[event] or 0) + d
    return MonSample(
        occupancy=None if occ is None else float(occ),
        total=None if sums["mbm_total_bytes"] is None else float(sums["mbm_total_bytes"]),
        local=None if sums["mbm_local_bytes"] is None else float(sums["mbm_local_bytes"]),
    )

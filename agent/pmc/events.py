"""Counter events by name: the hardware set the Snapshot carries and the software events
used for testing and as fallbacks (docs/RESCTRL.md, "perf_event_open")."""

from __future__ import annotations

from dataclasses import dataclass

from agent.pmc.perf_event import PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE


@dataclass(frozen=True, slots=True)
class EventSpec:
    name: str
    type: int
    config: int
    unit: str = "count"

    @property
    def hardware(self) -> bool:
        return self.type == PERF_TYPE_HARDWARE


EVENTS: dict[str, EventSpec] = {
    e.name: e
    for e in (
        # PERF_COUNT_HW_*
        EventSpec("cycles", PERF_TYPE_HARDWARE, 0),
        EventSpec("instructions", PERF_TYPE_HARDWARE, 1),
        EventSpec("llc_references", PERF_TYPE_HARDWARE, 2),  # CACHE_REFERENCES
        EventSpec("llc_misses", PERF_TYPE_HARDWARE, 3),  # CACHE_MISSES
        # PERF_COUNT_SW_*
        EventSpec("cpu_clock", PERF_TYPE_SOFTWARE, 0, "ns"),
        EventSpec("task_clock", PERF_TYPE_SOFTWARE, 1, "ns"),
        EventSpec("page_faults", PERF_TYPE_SOFTWARE, 2),
        EventSpec("context_switches", PERF_TYPE_SOFTWARE, 3),
        EventSpec("cpu_migrations", PERF_TYPE_SOFTWARE, 4),
    )
}

HARDWARE_EVENTS: tuple[str, ...] = ("instructions", "cycles", "llc_references", "llc_misses")
SOFTWARE_EVENTS: tuple[str, ...] = (
    "task_clock",
    "cpu_clock",
    "context_switches",
    "page_faults",
    "cpu_migrations",
)


def lookup(names: tuple[str, ...] | list[str]) -> tuple[EventSpec, ...]:
    """The specs of ``names``, in order; a clear error for unknown or repeated names."""
    unknown = [n for n in names if n not in EVENTS]
    if unknown:
        raise ValueError(f"unknown PMC event(s) {unknown}; known: {', '.join(EVENTS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"PMC event names repeated in {list(names)}")
    if not names:
        raise ValueError("no PMC events named")
    return tuple(EVENTS[n] for n in names)

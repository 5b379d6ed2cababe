"""PMC reader: hardware performance counters through ``perf_event_open`` (ctypes), grouped,
scaled for multiplexing, per task, per set of pids or per cgroup (docs/RESCTRL.md,
"perf_event_open").

API for a Node (e.g. ResctrlNode)::

    from agent.pmc import PmcReader, probe_events, HARDWARE_EVENTS

    supported, unsupported = probe_events()          # -> NodeCapabilities.pmc_events,
                                                     #    NodeCapabilities.pmc_unsupported
    reader = PmcReader(HARDWARE_EVENTS, supported=supported, unsupported=unsupported)
    reader.track("lc-memcached", pids=[1234])        # or tids=[...] (threads alone),
                                                     # or cgroup="/sys/fs/cgroup/x.slice"
    reader.read_deltas()   # {"lc-memcached": {"instructions": 1.2e9, ..., "llc_misses": None}}
    reader.untrack("lc-memcached"); reader.close()   # or: with PmcReader(...) as reader:

Values are estimates (count x enabled/running when the PMU multiplexed the group) and
None for events that do not work here. Lower level::

    with GroupCounters.for_pids([pid], ["task_clock", "page_faults"]) as c:   # or
        ...  # GroupCounters.for_cgroup(path, events) / GroupCounters.for_task(events)
        c.read()        # cumulative {event: float}
        c.read_delta()  # since the previous read_delta
        c.sample()      # a Reading with raw values, enabled/running times, scaling factors

Targets: ``for_pids`` counts every thread of each pid (and, with ``inherit``, what they
spawn later), one group per thread, summed. ``for_cgroup`` opens the cgroup directory and
one group per online CPU (PERF_FLAG_PID_CGROUP; needs root, CAP_PERFMON or
perf_event_paranoid <= 0), summed. File descriptors = events x CPUs (or threads): EMFILE
raises :class:`PmcTooManyFiles` saying how many were needed, and so does a
:class:`PmcReader` target that would leave fewer than ``fd_reserve`` descriptors free
(``limits.raise_nofile_limit`` raises the soft limit to the hard one at agent start).

Inherit and group reads: older kernels refuse PERF_FORMAT_GROUP with inherit
(EINVAL); the counters then fall back to one read per event (members still scheduled as
one group), visible as ``GroupCounters.group_read == False``.

Errors (all :class:`PmcError`, an ``agent.errors.NodeError``): :class:`PmcUnsupported`
(ENOENT, EOPNOTSUPP, ENODEV, ENXIO, EINVAL), :class:`PmcPermissionError` (EACCES/EPERM,
with the paranoid level and CAP_PERFMON hint), :class:`PmcTooManyFiles` (EMFILE/ENFILE),
:class:`PmcTaskGone` (ESRCH).
"""

from agent.pmc.counters import GroupCounters, Reading, online_cpus, scale
from agent.pmc.errors import (
    PmcError,
    PmcPermissionError,
    PmcTaskGone,
    PmcTooManyFiles,
    PmcUnsupported,
)
from agent.pmc.events import EVENTS, HARDWARE_EVENTS, SOFTWARE_EVENTS, EventSpec
from agent.pmc.probe import probe_events
from agent.pmc.reader import PmcReader, TargetCounters

__all__ = [
    "EVENTS",
    "HARDWARE_EVENTS",
    "SOFTWARE_EVENTS",
    "EventSpec",
    "GroupCounters",
    "PmcError",
    "PmcPermissionError",
    "PmcReader",
    "PmcTaskGone",
    "PmcTooManyFiles",
    "PmcUnsupported",
    "Reading",
    "TargetCounters",
    "online_cpus",
    "probe_events",
    "scale",
]

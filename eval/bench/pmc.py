"""Benchmark of the PMC reader (docs/RESCTRL.md, "perf_event_open"): the cost of
reading a group of 3 software counters (task_clock, context_switches, page_faults), as one
PERF_FORMAT_GROUP read and through the GroupCounters API, against one read per event, and
for a cgroup (one group per online CPU); plus the cost of probing the hardware events."""

from __future__ import annotations

import os

from agent.pmc import GroupCounters, PmcError, probe_events
from agent.pmc import perf_event as pe
from eval.bench.harness import Result, latencies, latency_result

TRIO = ["task_clock", "context_switches", "page_faults"]


def _own_cgroup_v2() -> str | None:
    """This process's cgroup v2 directory, when cgroup2 is mounted."""
    with open("/proc/self/mounts") as f:
        mounts = [line.split()[1] for line in f if line.split()[2:3] == ["cgroup2"]]
    with open("/proc/self/cgroup") as f:
        rel = next((line.strip()[3:] for line in f if line.startswith("0::")), None)
    if not mounts or rel is None:
        return None
    return os.path.join(mounts[0], rel.lstrip("/"))


def run(quick: bool) -> list[Result]:
    n = 2_000 if quick else 20_000
    results = []
    with GroupCounters.for_task(TRIO) as c:
        leader = c._groups[0].fds[0]
        size = pe.group_read_size(len(TRIO))
        results.append(
            latency_result(
                "pmc: one group read() syscall, 3 sw events",
                latencies(lambda: os.read(leader, size), n),
            )
        )
        results.append(
            latency_result(
                "pmc: GroupCounters.read_delta, 3 sw events (1 group)", latencies(c.read_delta, n)
            )
        )
    with GroupCounters.for_task(TRIO, group_read=False) as c:
        results.append(
            latency_result(
                "pmc: read_delta, 3 sw events, one read per event", latencies(c.read_delta, n)
            )
        )
    path = _own_cgroup_v2()
    if path is not None:
        try:
            with GroupCounters.for_cgroup(path, TRIO) as c:
                cpus = len(c._groups)
                results.append(
                    latency_result(
                        f"pmc: cgroup read_delta, 3 sw events x {cpus} CPUs",
                        latencies(c.read_delta, n // 2),
                    )
                )
        except PmcError as exc:
            print(f"(cgroup read skipped: {exc})")
    results.append(
        latency_result(
            "pmc: probe_events (4 hardware events)", latencies(probe_events, n // 100, warmup=3)
        )
    )
    return results

"""Observing a ResctrlNode: per own group, one interval of PMC counts (perf_event, per task or
per cgroup), resctrl monitoring counters turned into per-interval values (occupancy, MBM
bytes) and, for LC groups, the latency the service reported (docs/RESCTRL.md, "Layout" and
"perf_event_open"). A part of :class:`~agent.resctrl.node.ResctrlNode`."""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from agent.resctrl import discovery, monitor
from agent.resctrl.lock import ResctrlLock
from agent.types import (
    GroupKind,
    GroupSample,
    GroupSpec,
    LatencyStats,
    Snapshot,
)

log = logging.getLogger(__name__)


class PmcSource(Protocol):
    """What ResctrlNode needs of a PMC reader (agent.pmc.PmcReader fits)."""

    supported: frozenset[str]
    unsupported: Mapping[str, str]

    def track(self, name: str, *, tids: Iterable[int]) -> None: ...
    def untrack(self, name: str) -> None: ...
    def read_deltas(self) -> Mapping[str, Mapping[str, float | None] | None]: ...
    def close(self) -> None: ...


class LatencySource(Protocol):
    """Where LC latency comes from (agent.latency.LatencyRecorder fits)."""

    def drain(self, group: str) -> LatencyStats | None: ...


class Observation:
    """One interval's snapshot (a part of ResctrlNode)."""

    # The node's state (agent/resctrl/node.py sets it up).
    root: str
    prefix: str
    _lock: ResctrlLock
    _specs: dict[str, GroupSpec]
    _vanished: dict[str, GroupSpec]
    pmc: PmcSource | None
    latency: LatencySource | None
    _tracker: monitor.CounterTracker
    _pmc_tasks: dict[str, frozenset[int]]
    _pmc_warned: dict[str, str]
    _last_observe: float

    def _untrack(self, name: str) -> None:
        if self.pmc is not None and name in self._pmc_tasks:
            self._pmc_tasks.pop(name, None)
            try:
                self.pmc.untrack(name)
            except Exception as exc:
                log.debug("pmc untrack %s: %s", name, exc)

    def _pmc_deltas(
        self, tasks: Mapping[str, frozenset[int]]
    ) -> Mapping[str, Mapping[str, Any] | None]:
        """The interval's counts of each group, then its counters re-opened on the threads
        its ``tasks`` file lists now where they changed. In that order: counters opened now
        start counting now, so re-tracking first would leave a group whose threads come and
        go (thread pools) with the counts of the last microseconds instead of the interval.
        """
        if self.pmc is None or not self.pmc.supported:
            return {}
        try:
            deltas = self.pmc.read_deltas()
        except Exception as exc:
            log.warning("PMC read failed: %s", exc)
            deltas = {}
        for name, counts in deltas.items():
            if counts is None:  # unreadable: the reader untracked it, opened again below
                self._pmc_tasks.pop(name, None)
        for name, tids in tasks.items():
            if self._pmc_tasks.get(name) != tids:
                try:
                    # Thread ids, each counted alone: a process's other threads may be in
                    # other groups, and counting each listed thread's whole process would
                    # count a process of N threads N times over. Without inherit (the
                    # reader's default for tids): the tasks file is the membership, and a
                    # child started here and moved elsewhere is not counted here as well.
                    self.pmc.track(name, tids=sorted(tids))
                    self._pmc_tasks[name] = tids
                except Exception as exc:
                    # The group is untracked now (a re-track closes the old counters
                    # first): any thread set, the old one too, is opened again next time.
                    self._pmc_tasks.pop(name, None)
                    self._track_failed(name, exc)
        return deltas

    def _pmc_threads(self, name: str, d: str) -> frozenset[int] | None:
        """The threads whose counts are the group's, or None when they are not all of its
        work: a group holding CPUs also runs every default-group task on them, which
        per-thread counters cannot see, and per-CPU counters would count the other groups'
        tasks on those CPUs as well. Such a group is not counted (None, not a partial sum
        of its listed tasks), see docs/RESCTRL.md."""
        try:
            if discovery.read_text(os.path.join(d, "cpus_list")).strip():
                self._untrack(name)
                return None
            text = discovery.read_text(os.path.join(d, "tasks"))
        except OSError:
            return None
        return frozenset(int(x) for x in text.split() if x.isdigit())

    def _track_failed(self, name: str, exc: Exception) -> None:
        """Every thread exiting meanwhile is retried quietly next time; too few file
        descriptors (events x threads) or no privilege will not fix themselves, and the
        group's counts stay None until an operator acts: said once per group and reason."""
        lasting = isinstance(exc, PermissionError) or getattr(exc, "errno", None) in (
            errno.EMFILE,
            errno.ENFILE,
        )
        if not lasting:
            log.debug("pmc track %s: %s", name, exc)
        else:
            # by kind of failure, not by text: the text counts the descriptors open now,
            # which differ at every observation
            reason = f"{type(exc).__name__} {getattr(exc, 'errno', '')}"
            if self._pmc_warned.get(name) != reason:
                self._pmc_warned[name] = reason
                log.warning("no PMC counts for group %s: %s", name, exc)

    def observe(self) -> Snapshot:
        features = self._caps.monitoring.features if self._caps.monitoring else frozenset()
        mon_doms = self._caps.monitoring.domains if self._caps.monitoring else ()
        with self._lock.shared():
            self._check_vanished()
            now = time.monotonic()
            interval = max(now - self._last_observe, 1e-9)
            self._last_observe = now
            mon: dict[str, monitor.MonSample] = {}
            tasks: dict[str, frozenset[int]] = {}
            for name in list(self._specs):
                d = self._dir(name)
                mon[name] = monitor.sample_group(
                    name, os.path.join(d, "mon_data"), features, self._tracker, mon_doms
                )
                if self.pmc is not None and self.pmc.supported:
                    listed = self._pmc_threads(name, d)
                    if listed is not None:
                        tasks[name] = listed
            pmc = self._pmc_deltas(tasks)
        samples = {}
        for name, m in mon.items():
            counts = pmc.get(name) or {}
            latency = None
            spec = self._specs.get(name)
            if spec is not None and spec.kind is GroupKind.LC and self.latency is not None:
                latency = self.latency.drain(name) or LatencyStats.empty()
            samples[name] = GroupSample(
                instructions=counts.get("instructions"),
                cycles=counts.get("cycles"),
                llc_references=counts.get("llc_references"),
                llc_misses=counts.get("llc_misses"),
                llc_occupancy_bytes=m.occupancy,
                memory_bytes=m.total,
                memory_local_bytes=m.local,
                latency=latency,
            )
        # a PMC event enabled but never scheduled in the interval reads NaN: not measured
        return Snapshot(now, interval, samples, frozenset(self._vanished)).counted()

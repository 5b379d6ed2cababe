"""PmcReader: the facade a Node uses: knows which events work here, opens counters only
for those, and answers None for the rest (docs/RESCTRL.md, "perf_event_open": report
hardware events as unsupported, keep everything else working)."""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence

from agent.pmc.counters import GroupCounters, online_cpus
from agent.pmc.errors import PmcTooManyFiles
from agent.pmc.events import HARDWARE_EVENTS, lookup
from agent.pmc.limits import FD_RESERVE, nofile_soft_limit, open_fd_count
from agent.pmc.probe import probe_events

log = logging.getLogger(__name__)


class TargetCounters:
    """Counters for one target; events that do not work here read as None."""

    def __init__(
        self,
        events: Sequence[str],
        counters: GroupCounters | None,
        *,
        zero: Iterable[str] = (),
    ) -> None:
        self.events = tuple(events)
        self.counters = counters
        # Events measured as 0 without counters: a target with no task does no work.
        self._zero = dict.fromkeys(zero, 0.0)

    def _fill(self, values: Mapping[str, float]) -> dict[str, float | None]:
        return {e: values.get(e) for e in self.events}

    def read(self) -> dict[str, float | None]:
        return self._fill(self.counters.read() if self.counters else self._zero)

    def read_delta(self) -> dict[str, float | None]:
        return self._fill(self.counters.read_delta() if self.counters else self._zero)

    @property
    def fd_count(self) -> int:
        return self.counters.fd_count if self.counters else 0

    def close(self) -> None:
        if self.counters is not None:
            self.counters.close()

    def __enter__(self) -> TargetCounters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PmcReader:
    """Per-target counters for ``events``, of which only ``supported`` are opened.

    ``supported`` / ``unsupported`` come from :func:`probe_events` when not given (pass
    ``NodeCapabilities.pmc_events`` / ``pmc_unsupported`` to skip the probe). Targets are
    either opened and owned by the caller (``for_cgroup``, ``for_pids``) or tracked by name
    (``track``, ``read_deltas``, ``untrack``), which the reader closes on ``close()``.
    Opening raises the PmcError subclasses of ``agent.pmc`` (a pid that is gone:
    PmcTaskGone; too few fds: PmcTooManyFiles; no privilege: PmcPermissionError).
    Counters that would leave fewer than ``fd_reserve`` descriptors below RLIMIT_NOFILE
    are refused with PmcTooManyFiles: the rest of the process needs some too.
    """

    def __init__(
        self,
        events: Sequence[str] = HARDWARE_EVENTS,
        *,
        supported: Iterable[str] | None = None,
        unsupported: Mapping[str, str] | None = None,
        fd_reserve: int = FD_RESERVE,
    ) -> None:
        lookup(tuple(events))  # validate names
        self.fd_reserve = fd_reserve
        self.events = tuple(events)
        if supported is None:
            found, reasons = probe_events(self.events)
            self.supported = found
            self.unsupported = dict(reasons)
        else:
            self.supported = frozenset(supported) & frozenset(self.events)
            self.unsupported = {
                e: (unsupported or {}).get(e, "not supported on this node")
                for e in self.events
                if e not in self.supported
            }
        self.active = tuple(e for e in self.events if e in self.supported)
        self._tracked: dict[str, TargetCounters] = {}
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- owned by the caller

    def for_cgroup(self, path: str | os.PathLike[str]) -> TargetCounters:
        counters = None
        if self.active:
            cpus = len(online_cpus())
            formula = f"{len(self.active)} events x {cpus} CPUs + 1 cgroup directory"
            self._check_fds(len(self.active) * cpus + 1, formula, f"cgroup {os.fspath(path)}")
            counters = GroupCounters.for_cgroup(path, self.active)
        return TargetCounters(self.events, counters)

    def for_pids(self, pids: Iterable[int], *, inherit: bool = True) -> TargetCounters:
        """Processes ``pids``: every thread of each (GroupCounters.for_pids)."""
        return self._on_tasks(GroupCounters.for_pids, pids, inherit)

    def for_threads(self, tids: Iterable[int], *, inherit: bool = True) -> TargetCounters:
        """Threads ``tids``, each alone (GroupCounters.for_threads)."""
        return self._on_tasks(GroupCounters.for_threads, tids, inherit)

    def _on_tasks(self, open_on, ids: Iterable[int], inherit: bool) -> TargetCounters:
        ids = sorted(set(ids))
        if not ids:  # nothing to count: the active events are a measured 0, not unknown
            return TargetCounters(self.events, None, zero=self.active)
        counters = None
        if self.active:
            # for_pids opens every thread of each pid: this is the least it needs
            formula = f"{len(self.active)} events x {len(ids)} tasks"
            self._check_fds(len(self.active) * len(ids), formula, f"tasks {ids[:8]}")
            counters = open_on(ids, self.active, inherit=inherit)
        return TargetCounters(self.events, counters)

    def _check_fds(self, needed: int, formula: str, target: str) -> None:
        """Refuse counters that would eat into the descriptors kept for the rest of the
        process: once those are gone, any open() of the agent fails with EMFILE."""
        limit = nofile_soft_limit()
        if limit is None:
            return
        held = open_fd_count()
        free = limit - held - self.fd_reserve
        if needed > free:
            raise PmcTooManyFiles(
                f"counters on {target}: need {needed} file descriptors ({formula}) but "
                f"{max(free, 0)} are free: RLIMIT_NOFILE is {limit}, {held} are open and "
                f"{self.fd_reserve} are kept for the rest of the agent; raise it "
                "(LimitNOFILE=) or count fewer events or tasks",
                err=errno.EMFILE,
                needed=needed,
                target=target,
            )

    # ---------------------------------------------------------------- tracked by name

    def track(
        self,
        name: str,
        *,
        pids: Iterable[int] | None = None,
        tids: Iterable[int] | None = None,
        cgroup: str | os.PathLike[str] | None = None,
        inherit: bool | None = None,
    ) -> None:
        """(Re)open the counters of ``name`` on exactly one of: processes ``pids`` (every
        thread of each), threads ``tids`` (each alone: what a resctrl ``tasks`` file
        lists), or a ``cgroup`` directory.

        ``inherit`` (default: for ``pids`` yes, for ``tids`` no) also counts the threads and
        processes the counted ones start later. Not for a ``tasks`` file's threads: an
        inherited counter follows the child wherever it is moved, so a child moved to
        another group would be counted by both; the caller re-tracks with the new threads
        instead once the file lists them.

        Counters already open for ``name`` are closed first (counts since the last
        ``read_deltas`` are dropped with them), so a re-track needs the new counters' file
        descriptors only, not the old ones' as well: a group near ``RLIMIT_NOFILE`` would
        otherwise fail every re-track. When opening fails, ``name`` is left untracked."""
        if sum(x is not None for x in (pids, tids, cgroup)) != 1:
            raise ValueError("track: give exactly one of pids=, tids= or cgroup=")
        self.untrack(name)
        if cgroup is not None:
            target = self.for_cgroup(cgroup)
        elif tids is not None:
            target = self.for_threads(tids, inherit=bool(inherit))
        else:
            target = self.for_pids(pids or (), inherit=inherit is not False)
        with self._lock:
            old = self._tracked.pop(name, None)  # another thread's track meanwhile
            self._tracked[name] = target
        if old is not None:
            old.close()

    def untrack(self, name: str) -> None:
        with self._lock:
            target = self._tracked.pop(name, None)
        if target is not None:
            target.close()

    def tracked(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._tracked)

    def read_deltas(self) -> dict[str, dict[str, float | None] | None]:
        """Per tracked name: the counts since the previous call (an event's None:
        unsupported here). A name whose counters could not be read maps to None and is
        untracked, so that the caller's next ``track`` opens it afresh: the kernel answers a
        read of an event in error state with 0 bytes every time, and one such group must
        not cost every other group its counts."""
        with self._lock:
            targets = dict(self._tracked)
        out: dict[str, dict[str, float | None] | None] = {}
        for name, target in targets.items():
            try:
                out[name] = target.read_delta()
            except Exception as exc:  # whatever it is, it is this group's alone
                log.warning("PMC read of group %s failed, reopening it: %s", name, exc)
                self._drop(name, target)
                out[name] = None
        return out

    def _drop(self, name: str, target: TargetCounters) -> None:
        """Untrack ``name`` if it still holds ``target`` (not a newer track meanwhile)."""
        with self._lock:
            if self._tracked.get(name) is target:
                del self._tracked[name]
        target.close()

    @property
    def fd_count(self) -> int:
        with self._lock:
            return sum(t.fd_count for t in self._tracked.values())

    def close(self) -> None:
        with self._lock:
            targets = list(self._tracked.values())
            self._tracked.clear()
        for t in targets:
            t.close()

    def __enter__(self) -> PmcReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

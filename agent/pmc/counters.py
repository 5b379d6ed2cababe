"""Grouped counters: one leader + members per (target, CPU), read in one syscall, scaled
for multiplexing, summed over CPUs / threads / pids, with deltas between reads.

Implements docs/RESCTRL.md, "perf_event_open": ``read_format = GROUP | TOTAL_TIME_ENABLED |
TOTAL_TIME_RUNNING | ID``; a value counted for ``running`` of ``enabled`` ns estimates
``value * enabled / running``; a cgroup is counted with pid = the cgroup directory's fd,
PERF_FLAG_PID_CGROUP and one group per online CPU.
"""

from __future__ import annotations

import errno as _errno
import math
import os
import threading
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.pmc import perf_event as pe
from agent.pmc.errors import PmcError, translate
from agent.pmc.events import EventSpec, lookup

ONLINE_CPUS = "/sys/devices/system/cpu/online"

# One event of one group at one instant: (value, time_enabled ns, time_running ns).
Count = tuple[int, int, int]


# --------------------------------------------------------------------------- scaling


def scale(value: int, enabled: int, running: int) -> tuple[float, float]:
    """(estimate, factor) of a count taken for ``running`` of ``enabled`` ns.

    factor is enabled/running (1.0 when never multiplexed out, inf when enabled but
    never scheduled, in which case the estimate is 0 and means "not counted").
    """
    if running <= 0:
        return 0.0, (1.0 if enabled <= 0 else math.inf)
    if running >= enabled:
        return float(value), 1.0
    factor = enabled / running
    return value * factor, factor


@dataclass(frozen=True, slots=True)
class Reading:
    """Counter values, cumulative since enable or over one interval (``read_delta``).

    Attributes:
        values: event -> estimated count, raw * scaling; NaN when every group was
            enabled but none was ever scheduled.
        raw: event -> the unscaled sum.
        time_enabled / time_running: event -> ns summed over groups.
        scaling: event -> total enabled / total running (1.0: counted all the time; 2.0:
            counted half the time, values doubled to compensate).
    """

    values: dict[str, float]
    raw: dict[str, int]
    time_enabled: dict[str, int]
    time_running: dict[str, int]
    scaling: dict[str, float]

    @property
    def multiplexed(self) -> bool:
        return any(f > 1.0 for f in self.scaling.values())


def combine(names: Sequence[str], groups: Iterable[dict[str, Count]]) -> Reading:
    """Sum per-group counts, then scale the sums once (perf stat's aggregation).

    Scaling each group by its own times would count a group that was enabled but never
    scheduled in the interval (a thread's short bursts on a busy PMU) as 0, biasing the
    sum low while ``scaling`` claimed a larger correction; scaling the sums extrapolates
    it from the set's own rate, and ``values == raw * scaling`` holds for every event."""
    raw = dict.fromkeys(names, 0)
    enabled = dict.fromkeys(names, 0)
    running = dict.fromkeys(names, 0)
    for group in groups:
        for name, (v, e, r) in group.items():
            raw[name] += v
            enabled[name] += e
            running[name] += r
    values: dict[str, float] = {}
    scaling: dict[str, float] = {}
    for name in names:
        values[name], scaling[name] = scale(raw[name], enabled[name], running[name])
        if math.isinf(scaling[name]):
            values[name] = math.nan  # enabled, never scheduled: not measured, not 0
    return Reading(values, raw, enabled, running, scaling)


def delta(now: dict[str, Count], before: dict[str, Count]) -> dict[str, Count]:
    """Per-event difference of two reads of one group (scaled later by the interval's times)."""
    out = {}
    for name, (v, e, r) in now.items():
        v0, e0, r0 = before.get(name, (0, 0, 0))
        out[name] = (v - v0, e - e0, r - r0)
    return out


# --------------------------------------------------------------------------- one group


class _Group:
    """One leader + members on one (pid, cpu); owns its fds."""

    def __init__(
        self, specs: Sequence[EventSpec], fds: list[int], ids: dict[int, str], group_read: bool
    ) -> None:
        self.specs = specs
        self.fds = fds
        self.ids = ids
        self.group_read = group_read

    def read(self) -> dict[str, Count]:
        if self.group_read:
            raw = pe.read_group(self.fds[0], len(self.fds))
            return {
                self.ids[i]: (v, raw.time_enabled, raw.time_running) for i, v in raw.values.items()
            }
        out = {}
        for fd in self.fds:
            raw = pe.read_single(fd)
            for i, v in raw.values.items():
                out[self.ids[i]] = (v, raw.time_enabled, raw.time_running)
        return out

    def close(self) -> None:
        while self.fds:
            os.close(self.fds.pop())


def online_cpus(path: str = ONLINE_CPUS) -> list[int]:
    """Parse the kernel's CPU list (``0-3,8,10-11``)."""
    with open(path) as f:
        text = f.read().strip()
    cpus: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def threads_of(pid: int) -> list[int]:
    """Every thread id of a process (its main thread first); [pid] if /proc says nothing."""
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except (FileNotFoundError, ProcessLookupError):
        return [pid]
    return sorted(tids, key=lambda t: t != pid)


# --------------------------------------------------------------------------- counters


@dataclass(frozen=True, slots=True)
class _Target:
    pid: int  # a tid, -1 (all tasks, CPU-wide) or the cgroup fd
    cpu: int
    label: str
    required: bool = True  # False: a thread that may exit between listing and opening


class GroupCounters:
    """Counters for ``events`` on one target: a task, a set of pids, or a cgroup.

    Use the constructors :meth:`for_task`, :meth:`for_pids` and :meth:`for_cgroup`; the
    counters start enabled. ``read()`` gives cumulative estimates since then,
    ``read_delta()`` the estimates since the previous ``read_delta()`` (scaled with that
    interval's own enabled/running times). Close with ``close()`` or a ``with`` block.
    Methods are safe to call from several threads.
    """

    def __init__(
        self,
        events: Sequence[str],
        targets: Sequence[_Target],
        *,
        flags: int = 0,
        inherit: bool = False,
        exclude_kernel: bool = False,
        group_read: bool = True,
        describe: str = "",
        extra_fds: int = 0,
    ) -> None:
        self.events: tuple[str, ...] = tuple(events)
        self.specs = lookup(self.events)
        self.description = describe
        self.inherit = inherit
        self.exclude_kernel = exclude_kernel
        self.group_read = group_read
        self._groups: list[_Group] = []
        self._last: list[dict[str, Count]] = []
        self._lock = threading.Lock()
        self._closed = False
        self.fds_needed = len(self.specs) * len(targets) + extra_fds
        self._fds_formula = (
            f"{len(self.specs)} events x {len(targets)} "
            f"{'CPUs' if flags & pe.PERF_FLAG_PID_CGROUP else 'tasks'}"
            + (f" + {extra_fds} cgroup directory" if extra_fds else "")
        )
        try:
            for target in targets:
                group = self._open_group(target, flags)
                if group is not None:
                    self._groups.append(group)
            if not self._groups:
                raise PmcError(
                    f"nothing to count on {describe}: no task or CPU",
                    err=_errno.EINVAL,
                    target=describe,
                )
            for group in self._groups:
                pe.reset(group.fds[0])
                pe.enable(group.fds[0])
        except BaseException:
            self.close()
            raise
        self._last = [{} for _ in self._groups]

    # ---------------------------------------------------------------- constructors

    @classmethod
    def for_task(
        cls,
        events: Sequence[str],
        pid: int = 0,
        *,
        inherit: bool = False,
        exclude_kernel: bool = False,
        group_read: bool = True,
    ) -> GroupCounters:
        """One task (thread id; 0 = the calling thread) on any CPU.

        ``exclude_kernel`` counts user mode only: all an unprivileged process may count
        when perf_event_paranoid is 2."""
        return cls(
            events,
            [_Target(pid, -1, f"pid {pid}")],
            inherit=inherit,
            exclude_kernel=exclude_kernel,
            group_read=group_read,
            describe=f"pid {pid}",
        )

    @classmethod
    def for_pids(
        cls,
        pids: Iterable[int],
        events: Sequence[str],
        *,
        inherit: bool = True,
        threads: bool = True,
        exclude_kernel: bool = False,
        group_read: bool = True,
    ) -> GroupCounters:
        """The sum over processes ``pids``: every thread each has now (``threads``), and
        with ``inherit`` the threads and children they create after opening."""
        pids = sorted(set(pids))
        if not pids:
            raise ValueError("for_pids: no pids given")
        targets = []
        for pid in pids:
            if pid <= 0:
                raise ValueError(f"for_pids: invalid pid {pid}")
            tids = threads_of(pid) if threads else [pid]
            targets += [
                _Target(t, -1, f"pid {pid}" + (f" tid {t}" if t != pid else ""), required=t == pid)
                for t in tids
            ]
        return cls(
            events,
            targets,
            inherit=inherit,
            exclude_kernel=exclude_kernel,
            group_read=group_read,
            describe=f"pids {pids}",
        )

    @classmethod
    def for_threads(
        cls,
        tids: Iterable[int],
        events: Sequence[str],
        *,
        inherit: bool = True,
        exclude_kernel: bool = False,
        group_read: bool = True,
    ) -> GroupCounters:
        """The sum over threads ``tids``, each counted once (a resctrl ``tasks`` file lists
        thread ids, and a process's other threads may sit in other groups). A thread that
        exits before it is opened is skipped; with ``inherit`` the threads and children
        they create afterwards are counted too."""
        tids = sorted(set(tids))
        if not tids:
            raise ValueError("for_threads: no thread ids given")
        for tid in tids:
            if tid <= 0:
                raise ValueError(f"for_threads: invalid thread id {tid}")
        return cls(
            events,
            [_Target(t, -1, f"tid {t}", required=False) for t in tids],
            inherit=inherit,
            exclude_kernel=exclude_kernel,
            group_read=group_read,
            describe=f"threads {tids}",
        )

    @classmethod
    def for_cgroup(
        cls,
        path: str | os.PathLike[str],
        events: Sequence[str],
        *,
        cpus: Sequence[int] | None = None,
    ) -> GroupCounters:
        """Every task in cgroup ``path`` (and its descendants): one group per online CPU."""
        path = os.fspath(path)
        cpus = list(online_cpus() if cpus is None else cpus)
        try:
            dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise PmcError(
                f"cgroup {path!r}: cannot open the directory: {exc.strerror}",
                err=exc.errno or _errno.ENOENT,
                target=path,
                code="NOT_FOUND" if exc.errno == _errno.ENOENT else "INVALID_ARGUMENT",
            ) from None
        try:
            return cls(
                events,
                [_Target(dir_fd, cpu, f"cgroup {path} cpu {cpu}") for cpu in cpus],
                flags=pe.PERF_FLAG_PID_CGROUP,
                describe=f"cgroup {path}",
                extra_fds=1,
            )
        finally:
            os.close(dir_fd)  # the kernel holds its own reference to the cgroup

    # ---------------------------------------------------------------- opening

    def _open_group(self, target: _Target, flags: int) -> _Group | None:
        try:
            return self._open_group_as(target, flags, self.group_read)
        except OSError as exc:
            # Older kernels refuse PERF_FORMAT_GROUP together with inherit (EINVAL): fall
            # back to reading each member on its own (still scheduled as one group).
            if exc.errno == _errno.EINVAL and self.inherit and self.group_read:
                try:
                    group = self._open_group_as(target, flags, False)
                except OSError as retry:
                    # The retry's error is the one to report: the first EINVAL only said
                    # that this kernel wants single reads (an EMFILE or EACCES from the
                    # retry would otherwise read as "unsupported" and never be fixed).
                    raise self._translate(retry, target, flags) from None
                self.group_read = False
                return group
            raise self._translate(exc, target, flags) from None
        except _Skip:
            return None

    def _open_group_as(self, target: _Target, flags: int, group_read: bool) -> _Group:
        read_format = pe.GROUP_READ_FORMAT if group_read else pe.SINGLE_READ_FORMAT
        attr_flags = pe.ATTR_INHERIT if self.inherit else 0
        if self.exclude_kernel:
            attr_flags |= pe.ATTR_EXCLUDE_KERNEL | pe.ATTR_EXCLUDE_HV
        fds: list[int] = []
        ids: dict[int, str] = {}
        try:
            for spec in self.specs:
                leader = fds[0] if fds else -1
                attr = pe.make_attr(
                    spec.type,
                    spec.config,
                    read_format=read_format,
                    flags=attr_flags | (0 if fds else pe.ATTR_DISABLED),
                )
                try:
                    fd = pe.perf_event_open(
                        attr, target.pid, target.cpu, leader, flags | pe.PERF_FLAG_FD_CLOEXEC
                    )
                except OSError as exc:
                    exc.pmc_event = spec.name  # type: ignore[attr-defined]
                    if exc.errno == _errno.ESRCH and not target.required:
                        raise _Skip from None
                    raise
                fds.append(fd)
                ids[pe.event_id(fd)] = spec.name
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return _Group(self.specs, fds, ids, group_read)

    def _translate(self, exc: OSError, target: _Target, flags: int) -> PmcError:
        event = getattr(exc, "pmc_event", self.events[0])
        if exc.errno == _errno.EBADF and flags & pe.PERF_FLAG_PID_CGROUP:
            return PmcError(
                f"perf_event_open({event}) on {target.label}: not a cgroup directory the "
                "perf_event controller can use (a cgroup v2 directory, or one in a v1 "
                "perf_event hierarchy)",
                err=exc.errno,
                event=event,
                target=self.description,
                code="INVALID_ARGUMENT",
            )
        pid = None if flags & pe.PERF_FLAG_PID_CGROUP else target.pid
        return translate(
            exc,
            event=event,
            target=target.label,
            pid=pid,
            needed_fds=self.fds_needed,
            fds_formula=self._fds_formula,
        )

    # ---------------------------------------------------------------- reading

    @property
    def fd_count(self) -> int:
        return sum(len(g.fds) for g in self._groups)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise PmcError(
                f"counters on {self.description} are closed",
                err=_errno.EBADF,
                target=self.description,
            )

    def _read_groups(self) -> list[dict[str, Count]]:
        self._check_open()
        return [g.read() for g in self._groups]

    def sample(self) -> Reading:
        """Cumulative counts since the counters were (re)enabled."""
        with self._lock:
            return combine(self.events, self._read_groups())

    def sample_delta(self) -> Reading:
        """Counts since the previous ``sample_delta``/``read_delta`` (or since opening)."""
        with self._lock:
            now = self._read_groups()
            deltas = [delta(n, b) for n, b in zip(now, self._last, strict=True)]
            self._last = now
            return combine(self.events, deltas)

    def read(self) -> dict[str, float]:
        return self.sample().values

    def read_delta(self) -> dict[str, float]:
        return self.sample_delta().values

    def enable(self) -> None:
        with self._lock:
            self._check_open()
            for g in self._groups:
                pe.enable(g.fds[0])

    def disable(self) -> None:
        with self._lock:
            self._check_open()
            for g in self._groups:
                pe.disable(g.fds[0])

    def reset(self) -> None:
        """Zero the counts; ``read_delta`` restarts from here.

        The kernel does not reset time_enabled/time_running, so after a reset the
        cumulative ``sample()`` of a multiplexed event is scaled with times since opening;
        ``read_delta`` is exact (its baseline is a read taken right after the reset).
        """
        with self._lock:
            self._check_open()
            for g in self._groups:
                pe.reset(g.fds[0])
            self._last = self._read_groups()

    def close(self) -> None:
        """Close every fd (idempotent)."""
        with self._lock:
            self._closed = True
            while self._groups:
                self._groups.pop().close()

    def __enter__(self) -> GroupCounters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        groups = getattr(self, "_groups", None)
        if groups:
            warnings.warn(f"unclosed {self!r}", ResourceWarning, stacklevel=2)
            for g in groups:
                g.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.fd_count} fds"
        return f"GroupCounters({list(self.events)} on {self.description}, {state})"


class _Skip(Exception):
    """A non-required target vanished before it could be opened."""

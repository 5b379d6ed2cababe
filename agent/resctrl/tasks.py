"""Tasks and CPUs of a ResctrlNode's groups: listing a group's tasks, moving pids (each write
one kernel command; a refusal mid-batch puts the moved tasks back) and CPUs
(docs/RESCTRL.md, "Behaviour"). A part of :class:`~agent.resctrl.node.ResctrlNode`."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterable, Mapping

from agent.errors import (
    GroupNotFound,
    InvalidCpus,
    InvalidPid,
    KernelError,
    NodeError,
    UnknownTask,
)
from agent.resctrl import discovery
from agent.resctrl.lock import ResctrlLock
from agent.types import (
    GroupSpec,
    NodeCapabilities,
)

log = logging.getLogger(__name__)


class Tasks:
    """Tasks and CPUs (a part of ResctrlNode)."""

    # The node's state (agent/resctrl/node.py sets it up).
    root: str
    prefix: str
    _lock: ResctrlLock
    _caps: NodeCapabilities
    _specs: dict[str, GroupSpec]
    proc: str

    def tasks(self, group: str) -> frozenset[int]:
        path = self._path(group, "tasks")
        with self._lock.shared():
            self._require(group)
            self._require_unchanged([group])
            try:
                text = discovery.read_text(path)
            except FileNotFoundError:
                self._check_vanished()
                raise GroupNotFound(group, "it vanished") from None
        return frozenset(int(x) for x in text.split() if x.isdigit())

    def _locate(self, pids: set[int]) -> dict[int, str]:
        """The group directory (relative to the root, "" for the default group) of each pid,
        read before a move that can fail after a pid moved, so the moved ones go back."""
        where: dict[int, str] = {}
        for entry in [e for e in os.listdir(self.root) if e != "info"]:
            base = os.path.join(self.root, entry)
            for rel in [entry] + [
                os.path.join(entry, "mon_groups", m)
                for m in monitor_listdir(os.path.join(base, "mon_groups"))
            ]:
                for task in _tasks_of(os.path.join(self.root, rel, "tasks")):
                    if task in pids:
                        where[task] = rel
        for m in monitor_listdir(os.path.join(self.root, "mon_groups")):
            for task in _tasks_of(os.path.join(self.root, "mon_groups", m, "tasks")):
                if task in pids:
                    where[task] = os.path.join("mon_groups", m)
        return where

    def assign(self, group: str, *, pids: Iterable[int] = (), cpus: Iterable[int] = ()) -> None:
        pids = list(pids)
        cpus = list(cpus)
        for pid in pids:
            if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
                raise InvalidPid(
                    -1 if not isinstance(pid, int) else pid,
                    f"pid {pid!r} is not a positive integer",
                )
        for cpu in cpus:
            if not isinstance(cpu, int) or isinstance(cpu, bool) or cpu < 0:
                raise InvalidCpus(f"CPU {cpu!r} is not a CPU number")
        with self._lock.exclusive():
            self._require(group)
            if not os.path.isdir(self._dir(group)):
                self._check_vanished()
                raise GroupNotFound(group, "it vanished")
            self._require_unchanged([group])
            for pid in pids:
                if not os.path.exists(os.path.join(self.proc, str(pid))):
                    raise UnknownTask(pid, f"no task with pid {pid} (not in {self.proc})")
            if cpus:
                offline = set(cpus) - discovery.online_cpus(self.root)
                if offline:
                    raise InvalidCpus(
                        f"cannot assign CPUs {sorted(offline)} to group {group!r}: not online"
                    )
            # A lone pid whose own write fails moved nowhere, but one moved before a
            # refused CPU write has to go back: only then is the look-up needed.
            before = self._locate(set(pids)) if len(pids) > 1 or (pids and cpus) else {}
            moved: list[int] = []
            try:
                for pid in pids:
                    self._move(group, pid)
                    moved.append(pid)
                if cpus:
                    self._add_cpus(group, cpus)
            except NodeError:
                self._move_back(moved, before)
                raise

    def _move(self, group: str, pid: int) -> None:
        path = self._path(group, "tasks")
        try:
            self._write(path, f"{pid}\n")
        except OSError as exc:
            status = self._status()
            if exc.errno == errno.ESRCH:
                raise UnknownTask(
                    pid, f"no task with pid {pid} (the kernel says: {status or 'ESRCH'})"
                ) from None
            if exc.errno == errno.ENOENT:
                self._check_vanished()
                raise GroupNotFound(group, "it vanished") from None
            raise KernelError(
                f"cannot move task {pid} into group {group!r}",
                err=exc.errno or 0,
                status=status,
                path=path,
            ) from None

    def _move_back(self, moved: list[int], before: Mapping[int, str]) -> None:
        for pid in moved:
            rel = before.get(pid, "")
            # A task enters a monitoring group only from its control group (the kernel
            # refuses a move across control groups with EINVAL): that group's tasks first.
            head, sep, _ = ("/" + rel).rpartition("/mon_groups/")
            steps = [head.lstrip("/"), rel] if sep else [rel]
            try:
                for step in steps:
                    self._write(os.path.join(self.root, step, "tasks"), f"{pid}\n")
            except OSError as exc:
                log.error("could not return task %d to %r: %s", pid, rel or "/", exc)

    def _add_cpus(self, group: str, cpus: list[int]) -> None:
        path = self._path(group, "cpus_list")
        held = discovery.parse_cpu_list(discovery.read_text(path))
        # As ranges: kernfs takes a write of at most a page (E2BIG beyond), which a list
        # of every CPU of a large machine outgrows.
        text = discovery.format_cpu_list(held | set(cpus))
        try:
            self._write(path, text + "\n")
        except OSError as exc:
            status = self._status()
            if exc.errno == errno.EINVAL:
                raise InvalidCpus(
                    f"cannot assign CPUs {sorted(cpus)} to group {group!r}: "
                    f"{status or 'invalid CPU list'}"
                ) from None
            raise KernelError(
                f"cannot assign CPUs to group {group!r}",
                err=exc.errno or 0,
                status=status,
                path=path,
            ) from None


def monitor_listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _tasks_of(path: str) -> list[int]:
    """The task ids in a group's ``tasks`` file; none where there is no group (a file of
    the root, ``mon_data``) or no longer one (another tool removed it since its parent was
    listed: its tasks went back to the default group)."""
    try:
        text = discovery.read_text(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [int(x) for x in text.split() if x.isdigit()]

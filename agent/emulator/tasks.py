"""Tasks and CPUs of the emulated groups: which threads a group lists, moving threads
(``tasks`` writes, one pid or a comma-separated list by kernel version) and CPUs
(``cpus``/``cpus_list`` writes, mask or list format).

Mirrors rdtgroup.c (show_rdt_tasks, rdtgroup_tasks_write, rdtgroup_move_task,
rdtgroup_cpus_write). A part of :class:`~agent.emulator.model.Model`."""

from __future__ import annotations

import errno
import os
import threading

from agent.emulator.bitmap import BitmapError, parse_list, parse_mask
from agent.emulator.presets import Preset
from agent.emulator.schemata import kstrto
from agent.emulator.state import KERNEL_SPACE, Group, ResctrlError
from agent.emulator.topology import Topology


class TaskFiles:
    """Tasks and CPUs (a part of the Model)."""

    # The model's state (agent/emulator/model.py sets it up).
    p: Preset
    lock: threading.RLock
    status: str
    root: Group
    groups: dict[str, Group]
    proc: str
    topo: Topology
    online: set[int]
    task_group: dict[int, Group]
    seen: set[int]
    denied: set[int]
    _children_files: bool | None = None

    def _pid_alive(self, pid: int) -> bool:
        # /proc/<tid> resolves for every thread, though only leaders are listed in /proc.
        return pid > 0 and os.path.exists(f"{self.proc}/{pid}")

    def _threads(self) -> set[int]:
        """Every thread id of the system (the kernel's for_each_process_thread)."""
        out: set[int] = set()
        try:
            leaders = [x for x in os.listdir(self.proc) if x.isdigit()]
        except OSError:
            return out
        for pid in leaders:
            try:
                out.update(int(t) for t in os.listdir(f"{self.proc}/{pid}/task") if t.isdigit())
            except OSError:
                continue  # exited while we looked
        return out

    def _settle(self) -> set[int]:
        """Every thread of the system, each new one (not seen before) in its creator's
        group: fork and clone copy the creator's task_struct, CLOSID and RMID with it
        (dup_task_struct), so a workload placed by its first pid keeps the processes and
        threads it starts. The creator is taken to be a thread's group leader, or a
        process's parent (what /proc tells; the thread that called clone is not kept).
        Settled before a listing of the default group, which needs every thread; exited
        threads leave every group."""
        threads = self._threads()
        gone = [t for t in self.task_group if t not in threads and not self._pid_alive(t)]
        self._place(gone, threads - self.seen)
        self.seen = threads | set(self.task_group)
        return threads

    def _settle_near(self, *moving: int) -> None:
        """:meth:`_settle` for the threads that can be in a group other than the default
        one: those descended from a thread a group holds, or from ``moving`` (settled
        before they move, so a thread started before a move keeps the group its creator
        had then). A walk of every thread reads /proc for each of the system's processes;
        this one reads it for the groups' own, so listing a group or moving a task costs
        what its workload holds, not what the machine runs."""
        if not self._has_children_files():
            self._settle()
            return
        gone = [t for t in self.task_group if not self._pid_alive(t)]
        new: set[int] = set()
        explored: set[int] = set()
        frontier = [*self.task_group, *moving]
        while frontier:
            tid = frontier.pop()
            if tid in explored:
                continue
            threads, children = self._family(tid)
            explored |= threads
            for t in (threads | children) - self.seen - new:
                new.add(t)
                frontier.append(t)
        self._place(gone, new)
        self.seen |= new

    def _place(self, gone: list[int], new: set[int]) -> None:
        """Drop the exited ``gone`` from their groups and put each of ``new`` in its
        creator's, advancing the counters first (what they counted so far belongs to the
        groups as they were)."""
        if gone:
            self._advance()
        for tid in gone:
            del self.task_group[tid]
            self.seen.discard(tid)
        placed: dict[int, Group] = {}
        pending = set(new)
        for tid in sorted(new):
            self._inherit(tid, pending, placed, depth=0)
        if placed:
            self._advance()
            self.task_group.update(placed)

    def _family(self, tid: int) -> tuple[set[int], set[int]]:
        """The threads of ``tid``'s process, and the processes they started (their
        leaders): every task whose creator, as :func:`_creator` tells, is in it."""
        base = f"{self.proc}/{tid}/task"
        try:
            threads = {int(t) for t in os.listdir(base) if t.isdigit()}
        except OSError:
            return set(), set()  # exited while we looked
        children: set[int] = set()
        for t in threads:
            try:
                with open(f"{base}/{t}/children") as f:
                    children.update(int(c) for c in f.read().split())
            except OSError:
                continue
        return threads, children

    def _has_children_files(self) -> bool:
        """Whether /proc lists each thread's children (CONFIG_PROC_CHILDREN); without
        them only a walk of every thread finds a group's new processes."""
        if self._children_files is None:
            me = os.getpid()
            self._children_files = os.path.exists(f"{self.proc}/{me}/task/{me}/children")
        return self._children_files

    def _inherit(self, tid: int, new: set[int], placed: dict[int, Group], depth: int) -> Group:
        """``tid``'s group; a new thread's is its creator's (settled first when new too),
        recorded in ``placed`` when it is not the root."""
        if tid not in new or depth > 64:
            return placed.get(tid) or self.task_group.get(tid, self.root)
        new.discard(tid)
        creator = _creator(self.proc, tid)
        group = self.root if creator is None else self._inherit(creator, new, placed, depth + 1)
        if group is not self.root and group.alive:
            placed[tid] = group
        return group if group.alive else self.root

    def _tasks_of(self, g: Group) -> set[int]:
        # show_rdt_tasks: every thread whose CLOSID is a control group's (so a control
        # group, the default one too, lists the tasks of its monitoring groups) or whose
        # RMID is a monitoring group's.
        if g is self.root:
            threads = self._settle()
            return {t for t in threads if self.task_group.get(t, self.root).ctrl_group is self.root}
        self._settle_near()
        if g.kind == "ctrl":
            return {t for t, h in self.task_group.items() if h.ctrl_group is g}
        return {t for t, h in self.task_group.items() if h is g}

    def _write_tasks(self, g: Group, text: str, writer: int) -> None:
        # rdtgroup_tasks_write. Before 6.7: one pid, parsed before the status is cleared.
        # From 6.7: comma-separated pids moved in turn; a failed move appends
        # "Error while processing task N" to its reason, and earlier moves stay. Pid 0 is
        # the writing task itself (rdtgroup_move_task: ``current``).
        if not self.rules.multi_pid_tasks:
            pid = _kstrtoint(text.strip(KERNEL_SPACE))
            if pid is None or pid < 0:
                raise ResctrlError(errno.EINVAL)
            self.status = "ok"
            self._move_task(g, pid, writer)
            return
        self.status = "ok"
        buf: str | None = text
        while buf and buf[0] not in "\0\n":
            pid_str, sep, rest = buf.partition(",")
            buf = rest if sep else None
            pid_str = pid_str.strip(KERNEL_SPACE)
            pid = _kstrtoint(pid_str)
            if pid is None:
                self.status = f"Task list parsing error pid {pid_str}"
                raise ResctrlError(errno.EINVAL)
            if pid < 0:
                self.status = f"Invalid pid {pid}"
                raise ResctrlError(errno.EINVAL)
            try:
                self._move_task(g, pid, writer)
            except ResctrlError:
                self.status += f"\nError while processing task {pid}"
                raise

    def _move_task(self, g: Group, tid: int, writer: int) -> None:
        """rdtgroup_move_task for one thread id (writing a process's pid moves only its
        main thread: find_task_by_vpid finds that one task); 0 moves ``writer``, the
        kernel's ``current``, which needs no lookup and may always move itself."""
        if tid == 0:
            tid = writer
        elif not self._pid_alive(tid):
            self.status = f"No task {tid}"
            raise ResctrlError(errno.ESRCH)
        elif tid in self.denied:
            self.status = f"No permission to move task {tid}"
            raise ResctrlError(errno.EPERM)
        self._settle_near(tid)  # threads started before this move keep their creators' groups
        cur = self.task_group.get(tid, self.root)
        if cur is g:
            return  # already there: nothing to do, and no CLOSID check
        if g.kind == "mon" and cur.ctrl_group is not g.parent:
            self.status = "Can't move task to different control group"
            raise ResctrlError(errno.EINVAL)
        self._advance()
        if g is self.root:
            self.task_group.pop(tid, None)
        else:
            self.task_group[tid] = g

    def _parse_cpus(self, text: str, as_list: bool) -> set[int]:
        # rdtgroup_cpus_write: cpulist_parse / cpumask_parse; their errno passes through.
        try:
            if as_list:
                return parse_list(text, self.topo.possible)
            return parse_mask(text, self.topo.possible)
        except BitmapError as exc:
            self.status = "Bad CPU list/mask"
            raise ResctrlError(exc.err) from None

    def _write_cpus(self, g: Group, text: str, as_list: bool) -> None:
        self.status = "ok"
        new = self._parse_cpus(text, as_list)
        if new - self.online:
            self.status = "Can only assign online CPUs"
            raise ResctrlError(errno.EINVAL)
        self._advance()
        if g.kind == "ctrl":
            dropped = g.cpus - new
            if dropped:
                if g is self.root:
                    self.status = "Can't drop CPUs from default group"
                    raise ResctrlError(errno.EINVAL)
                self.root.cpus |= dropped
            added = new - g.cpus
            for other in self._ctrl_groups():
                if other is not g:
                    other.cpus -= added
                    for child in other.mon_children.values():
                        child.cpus -= added
            g.cpus = set(new)
            for child in g.mon_children.values():
                child.cpus.clear()
        else:
            parent = g.parent
            assert parent is not None
            if new - parent.cpus:
                self.status = "Can only add CPUs to mongroup that belong to parent"
                raise ResctrlError(errno.EINVAL)
            added = new - g.cpus
            for sib in parent.mon_children.values():
                if sib is not g:
                    sib.cpus -= added
            g.cpus = set(new)


def _creator(proc: str, tid: int) -> int | None:
    """The thread ``tid`` was most likely created by: its group leader for a thread, its
    parent for a process' leader; None when /proc does not say (or it has exited)."""
    try:
        with open(f"{proc}/{tid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        tgid, ppid = int(fields["Tgid"]), int(fields["PPid"])
    except (OSError, KeyError, ValueError):
        return None
    creator = tgid if tgid != tid else ppid
    return creator if creator > 0 else None


def _kstrtoint(text: str) -> int | None:
    """The kernel's kstrtoint(s, 0) (:func:`kstrto`); None where it fails."""
    try:
        return kstrto(text, signed=True)
    except (ValueError, OverflowError):
        return None

"""A pure-Python model of the kernel's resctrl filesystem, addressed by path.

Mirrors fs/resctrl in the kernel (rdtgroup.c: mkdir/rmdir, tasks, cpus, mode, CLOSID
allocation, new-group masks; ctrlmondata.c: schemata parsing and printing, ``cbm_validate``,
``bw_validate``; monitor.c: RMIDs, limbo, counters) for the kernel version its preset names
(kernel.py), with the CPU bitmap formats of lib/bitmap-str.c (bitmap.py) and the domains of
the preset's CPU topology (topology.py); docs/EMULATOR.md lists the rules. It deliberately
shares no code with ResctrlNode or agent/validate.py, so a bug in the validator cannot hide
behind the emulator.

The model is composed of its parts, each in its own module: the file tree and reads
(tree.py), schemata and mode writes (schemata.py), tasks and CPUs (tasks.py), RMIDs and
monitoring counters (counters.py), over the state in state.py; this module sets the state
up and holds the commands that change the tree (mkdir, rmdir) and the write dispatch.

Every method that changes state is one "kernel command": it clears ``last_cmd_status``
(except where the kernel fails before that, and rmdir, which never does), appends the
kernel's messages to it and raises :class:`ResctrlError` with the kernel's errno. Tasks are
threads, as in the kernel: every thread id in /proc/*/task is a task, and a group lists the
ids of its threads; a new thread or process starts in its creator's group (agent/emulator/
tasks.py). Tests reach in through the injection hooks at the bottom of the class.
"""

from __future__ import annotations

import errno
import threading
import time
from collections import deque
from collections.abc import Callable

from agent.emulator.counters import Counters
from agent.emulator.kernel import PAGE_SIZE
from agent.emulator.presets import MBPS_DEFAULT, Preset
from agent.emulator.schemata import SchemataFiles, kstrto
from agent.emulator.state import COUNTER_SPECIALS, Group, ResctrlError, Rmid
from agent.emulator.tasks import TaskFiles
from agent.emulator.tree import TreeFiles

__all__ = ["COUNTER_SPECIALS", "Group", "Model", "ResctrlError", "Rmid"]


class Model(TreeFiles, SchemataFiles, TaskFiles, Counters):
    """The resctrl tree of one emulated machine. Thread-safe (FUSE calls in parallel)."""

    def __init__(
        self,
        preset: Preset,
        clock: Callable[[], float] = time.monotonic,
        proc: str = "/proc",
    ) -> None:
        self.p = preset
        self.clock = clock
        self.proc = proc
        self.lock = threading.RLock()
        self.status = "ok"
        self.threshold = preset.max_threshold_occupancy  # info/L3_MON/max_threshold_occupancy
        self.rules = preset.rules
        self.topo = preset.topo
        self.domains = self.topo.domains
        self.online = set(self.topo.online)
        self.cbm_len = preset.cbm_len
        cdp_div = 2 if preset.cdp else 1
        counts = [preset.l3_closids // cdp_div]
        if preset.mb is not None:
            counts.append(preset.mb.num_closids)
        self.num_closids = min(counts)
        self.free_closids = set(range(1, self.num_closids))
        self.free_rmids: deque[int] = deque(range(1, preset.num_rmids))
        self.limbo: list[tuple[float, int]] = []
        self.rmids: dict[int, Rmid] = {}
        self.root = Group("", "ctrl", 0, 0, cpus=set(self.online))
        self.root.ctrl = self._default_ctrl(full=True)
        self.groups: dict[str, Group] = {}  # ctrl groups below the root, by name
        self.task_group: dict[int, Group] = {}  # thread id -> its group (absent: the root)
        self.seen: set[int] = self._threads()  # threads whose group is settled: all root's
        self.denied: set[int] = set()
        self.last_advance = self.clock()
        self._rates_cache: dict[int, tuple[float, dict[int, float]]] | None = None
        self._new_rmid_state(0)
        self.overrides: dict[tuple[int, str, int | None], str] = {}
        self.failures: list[tuple[str, int, str, int]] = []

    @property
    def l3_schemas(self) -> tuple[str, ...]:
        return ("L3DATA", "L3CODE") if self.p.cdp else ("L3",)

    @property
    def schemas(self) -> tuple[str, ...]:
        return self.rules.schema_order(self.l3_schemas, self.p.mb is not None)

    def _mb_default(self) -> int:
        assert self.p.mb is not None
        return MBPS_DEFAULT if self.p.mba_mbps else self.p.mb.max_bandwidth

    def _default_ctrl(self, full: bool) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for s in self.l3_schemas:
            out[s] = {d: self.p.cbm_mask if full else self._new_cbm(s, d) for d in self.domains}
        if self.p.mb is not None:
            out["MB"] = {d: self._mb_default() for d in self.domains}
        return out

    def _ctrl_groups(self) -> list[Group]:
        return [self.root, *self.groups.values()]

    def _new_cbm(self, schema: str, dom: int) -> int:
        # rdtgroup.c __init_one_rdt_domain: shareable bits, the masks of shareable groups
        # and every unused bit, a group's code and data masks both counting under CDP (so
        # no new group overlaps an exclusive group's peer mask); then cbm_ensure_valid
        # keeps the lowest contiguous run, sparse masks or not.
        peer = {"L3CODE": "L3DATA", "L3DATA": "L3CODE"}.get(schema)
        used = self.p.shareable_bits
        new = self.p.shareable_bits
        for g in self._ctrl_groups():
            val = g.ctrl[schema][dom] | (g.ctrl[peer][dom] if peer else 0)
            used |= val
            if g.mode == "shareable":
                new |= val
        new |= ~used & self.p.cbm_mask
        if new:
            low = new & -new
            run = new + low
            new &= (run & -run) - 1
        if new.bit_count() < self.p.min_cbm_bits:
            self.status = f"No space on {schema}:{dom}"
            raise ResctrlError(errno.ENOSPC)
        return new

    def write(self, path: str, data: bytes, writer: int | None = None) -> int:
        """One write(2) to ``path``: one kernel command. Returns the bytes consumed.
        ``writer``: the writing thread's id (the kernel's ``current``; default the calling
        thread's), which a ``tasks`` write of pid 0 moves."""
        with self.lock:
            kind = self.kind(path)
            if kind is None:
                raise ResctrlError(errno.ENOENT)
            if kind != "wfile":
                raise ResctrlError(errno.EACCES if kind == "file" else errno.EISDIR)
            if len(data) > PAGE_SIZE:  # kernfs: atomic_write_len (agent/emulator/kernel.py)
                raise ResctrlError(errno.E2BIG)
            # The kernel parses bytes: one that is no UTF-8 is refused by the command's own
            # parser (after it clears last_cmd_status), and its message repeats the byte.
            text = data.decode("utf-8", "surrogateescape")
            for i, (suffix, err, status, skip) in enumerate(self.failures):
                if path.endswith(suffix):
                    if skip:
                        self.failures[i] = (suffix, err, status, skip - 1)
                        break  # this write goes through
                    del self.failures[i]
                    self.status = status
                    raise ResctrlError(err)
            parts = [x for x in path.split("/") if x]
            if parts[0] == "info":  # the one writable file there
                self._write_threshold(text)
                return len(data)
            g, rest = self._resolve_group(parts)  # type: ignore[misc]
            name = rest[0]
            if name == "schemata":
                self._write_schemata(g, text)
            elif name == "tasks":
                self._write_tasks(g, text, threading.get_native_id() if writer is None else writer)
            elif name in ("cpus", "cpus_list"):
                self._write_cpus(g, text, as_list=name == "cpus_list")
            elif name == "mode":
                self._write_mode(g, text)
            return len(data)

    def _write_threshold(self, text: str) -> None:
        # max_threshold_occ_write: kstrtouint(buf, 0), its EINVAL or ERANGE returned as is
        # and last_cmd_status left alone; at most the cache's size; kept rounded down to
        # the counters' unit (resctrl_arch_round_mon_val).
        try:
            value = kstrto(text)
        except ValueError:
            raise ResctrlError(errno.EINVAL) from None
        except OverflowError:
            raise ResctrlError(errno.ERANGE) from None
        if value > self.p.cache_size:
            raise ResctrlError(errno.EINVAL)
        self.threshold = value // self.p.mon_scale * self.p.mon_scale

    def mkdir(self, path: str) -> None:
        with self.lock:
            parts = [x for x in path.split("/") if x]
            if not parts:
                raise ResctrlError(errno.EEXIST)
            name = parts[-1]
            if self.kind(path) is not None:
                raise ResctrlError(errno.EEXIST)
            parent = "/".join(parts[:-1])
            if "\n" in name:
                raise ResctrlError(errno.EINVAL)
            self.status = "ok"
            if len(parts) == 1:
                self._mkdir_ctrl(name)
                return
            found = self._resolve_group(parts[:-1])
            # is_mon_groups: a monitoring group goes in a mon_groups directory and is not
            # itself named mon_groups.
            if (
                found is None
                or found[1] != ["mon_groups"]
                or name == "mon_groups"
                or not self.p.mon_features
            ):
                raise ResctrlError(errno.EPERM if self.kind(parent) else errno.ENOENT)
            ctrl = found[0]
            self._advance()
            rmid = self._alloc_rmid()
            self._new_rmid_state(rmid)
            ctrl.mon_children[name] = Group(name, "mon", ctrl.closid, rmid, parent=ctrl)

    def _mkdir_ctrl(self, name: str) -> None:
        if not self.free_closids:
            self.status = "Out of CLOSIDs"
            raise ResctrlError(errno.ENOSPC)
        closid = min(self.free_closids)
        rmid = 0
        if self.p.mon_features:
            rmid = self._alloc_rmid()
        try:
            ctrl = self._default_ctrl(full=False)
        except ResctrlError:
            if self.p.mon_features:
                self._free_rmid(rmid)
            raise
        self._advance()
        self.free_closids.discard(closid)
        g = Group(name, "ctrl", closid, rmid, ctrl=ctrl)
        self.groups[name] = g
        if self.p.mon_features:
            self._new_rmid_state(rmid)

    def rename(self, old: str, new: str) -> None:
        """rename(2): from 6.5 ``rdtgroup_rename`` moves a monitoring group to another name
        or under another control group's ``mon_groups``, its RMID and counters kept and its
        tasks taking the new parent's CLOSID (``mongrp_reparent``); anything else, and
        every rename before 6.5, is EPERM."""
        with self.lock:
            if not self.rules.renames_mon_groups:
                raise ResctrlError(errno.EPERM)
            src = [x for x in old.split("/") if x]
            dst = [x for x in new.split("/") if x]
            kind = self.kind(old)
            found = self._resolve_group(src) if kind is not None else None
            if found is None:
                raise ResctrlError(errno.ENOENT)
            self.status = "ok"
            if kind != "dir":
                self.status = "Source and destination must be directories"
                raise ResctrlError(errno.EPERM)
            g, rest = found
            if g.kind != "mon" or rest:
                self.status = "Source must be a MON group"
                raise ResctrlError(errno.EPERM)
            where = dst[:-1]
            if dst[-1] == "mon_groups":  # is_mon_groups refuses that name too
                parent = None
            elif where == ["mon_groups"]:
                parent = self.root
            elif len(where) == 2 and where[1] == "mon_groups" and where[0] in self.groups:
                parent = self.groups[where[0]]
            else:
                parent = None
            if parent is None:
                self.status = "Destination must be a mon_groups subdirectory"
                raise ResctrlError(errno.EPERM)
            if g.cpus and parent is not g.parent:
                self.status = "Cannot move a MON group that monitors CPUs"
                raise ResctrlError(errno.EPERM)
            name = dst[-1]
            if parent.mon_children.get(name, g) is not g:
                raise ResctrlError(errno.EEXIST)  # kernfs_rename's, the status left "ok"
            self._advance()
            assert g.parent is not None
            del g.parent.mon_children[g.name]
            g.name, g.parent = name, parent
            parent.mon_children[name] = g

    def rmdir(self, path: str) -> None:
        with self.lock:
            parts = [x for x in path.split("/") if x]
            kind = self.kind(path)
            if kind is None:
                raise ResctrlError(errno.ENOENT)
            if kind != "dir":
                raise ResctrlError(errno.ENOTDIR)
            found = self._resolve_group(parts)
            if not parts or found is None or found[1] or found[0] is self.root:
                raise ResctrlError(errno.EPERM)
            g = found[0]
            self._advance()  # rdtgroup_rmdir leaves last_cmd_status as it was
            if g.kind == "mon":
                parent = g.parent
                assert parent is not None
                for pid, h in list(self.task_group.items()):
                    if h is g:
                        self.task_group[pid] = parent
                del parent.mon_children[g.name]
                self._free_rmid(g.rmid)
            else:
                for pid, h in list(self.task_group.items()):
                    if h.ctrl_group is g:
                        del self.task_group[pid]
                self.root.cpus |= g.cpus
                for child in g.mon_children.values():
                    child.alive = False
                    self._free_rmid(child.rmid)
                del self.groups[g.name]
                self.free_closids.add(g.closid)
                if self.p.mon_features:
                    self._free_rmid(g.rmid)
            g.alive = False

    # ------------------------------------------------------------------ test hooks

    def _group_by_path(self, group_path: str) -> Group:
        found = self._resolve_group([x for x in group_path.split("/") if x])
        if found is None or found[1]:
            raise KeyError(f"no group at {group_path!r}")
        return found[0]

    def fail_next_write(
        self, path_suffix: str, err: int, status: str = "ok", *, after: int = 0
    ) -> None:
        """Make the next write to a path ending in ``path_suffix`` (or the one after
        ``after`` more such writes) fail with ``err``, leaving ``status`` in last_cmd_status
        (a refusal the validator did not foresee)."""
        with self.lock:
            self.failures.append((path_suffix, err, status, after))

    def deny_task(self, pid: int) -> None:
        """Moving ``pid`` fails with EPERM (a task the writer may not move)."""
        with self.lock:
            self.denied.add(pid)

"""A pure-Python model of the kernel's resctrl filesystem, addressed by path.

Mirrors fs/resctrl in the kernel (rdtgroup.c: mkdir/rmdir, tasks, cpus, mode, CLOSID
allocation, new-group masks; ctrlmondata.c: schemata parsing and printing, ``cbm_validate``,
``bw_validate``; monitor.c: RMIDs, limbo, counters) for the kernel version its preset names
(kernel.py), with the CPU bitmap formats of lib/bitmap-str.c (bitmap.py) and the domains of
the preset's CPU topology (topology.py); docs/EMULATOR.md lists the rules. It deliberately
shares no code with ResctrlNode or agent/validate.py, so a bug in the validator cannot hide
behind the emulator.

Every method that changes state is one "kernel command": it clears ``last_cmd_status``
(except where the kernel fails before that), appends the kernel's messages to it and raises
:class:`ResctrlError` with the kernel's errno. Tasks are threads, as in the kernel: every
thread id in /proc/*/task is a task, and a group lists the ids of its threads. Tests reach
in through the injection hooks at the bottom of the class.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.emulator.bitmap import BitmapError, format_list, format_mask, parse_list, parse_mask
from agent.emulator.presets import MBPS_DEFAULT, Preset

U64 = (1 << 64) - 1
COUNTER_SPECIALS = ("Unavailable", "Error", "Unassigned")
# Deterministic "workload" behind the counters: bytes/s per task and per CPU in a group,
# and the LLC footprint each brings (so occupancy depends on the mask and the members).
TASK_BPS = 64 * 1024 * 1024
CPU_BPS = 16 * 1024 * 1024
TASK_FOOTPRINT = 6 * 1024 * 1024
CPU_FOOTPRINT = 1024 * 1024


class ResctrlError(OSError):
    """A refused kernel command: errno plus what it left in ``last_cmd_status``."""

    def __init__(self, err: int, status: str | None = None) -> None:
        super().__init__(err, os.strerror(err))
        self.status = status


@dataclass
class Rmid:
    """Monitoring state of one RMID: cumulative counters per domain, integrated lazily."""

    rmid: int
    total: dict[int, int] = field(default_factory=dict)
    local: dict[int, int] = field(default_factory=dict)
    carry: dict[int, float] = field(default_factory=dict)


@dataclass
class Group:
    """A control group (``ctrl``, own CLOSID and RMID) or a monitoring group (``mon``)."""

    name: str
    kind: str
    closid: int
    rmid: int
    parent: Group | None = None
    mode: str = "shareable"
    cpus: set[int] = field(default_factory=set)
    # schema name (L3, L3CODE, L3DATA, MB) -> domain -> value
    ctrl: dict[str, dict[int, int]] = field(default_factory=dict)
    mon_children: dict[str, Group] = field(default_factory=dict)
    alive: bool = True

    @property
    def ctrl_group(self) -> Group:
        return self if self.kind == "ctrl" else self.parent  # type: ignore[return-value]


class Model:
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
        self.task_group: dict[int, Group] = {}  # thread id -> the group it was moved into
        self.denied: set[int] = set()
        self.last_advance = self.clock()
        self._rates_cache: dict[int, tuple[float, dict[int, float]]] | None = None
        self._new_rmid_state(0)
        self.overrides: dict[tuple[int, str, int | None], str] = {}
        self.failures: list[tuple[str, int, str]] = []

    # ------------------------------------------------------------------ schema basics

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
        # and every unused bit; then cbm_ensure_valid keeps the lowest contiguous run.
        used = self.p.shareable_bits
        new = self.p.shareable_bits
        for g in self._ctrl_groups():
            val = g.ctrl[schema][dom]
            used |= val
            if g.mode == "shareable":
                new |= val
        new |= ~used & self.p.cbm_mask
        if not self.p.sparse_masks and new:
            low = new & -new
            run = new + low
            new &= (run & -run) - 1
        if new.bit_count() < self.p.min_cbm_bits:
            self.status = f"No space on {schema}:{dom}"
            raise ResctrlError(errno.ENOSPC)
        return new

    # ------------------------------------------------------------------ path resolution

    def _resolve_group(self, parts: list[str]) -> tuple[Group, list[str]] | None:
        """The group a path lies in, and the rest of the path inside it."""
        g = self.root
        rest = parts
        if rest and rest[0] in self.groups:
            g, rest = self.groups[rest[0]], rest[1:]
        if len(rest) >= 2 and rest[0] == "mon_groups" and g.kind == "ctrl":
            child = g.mon_children.get(rest[1])
            if child is None:
                return None
            g, rest = child, rest[2:]
        return g, rest

    def _group_files(self, g: Group) -> list[str]:
        files = ["tasks", "cpus", "cpus_list"]
        if g.kind == "ctrl":
            files += ["schemata", "size", "mode"]
        return files

    def _group_dirs(self, g: Group) -> list[str]:
        dirs = ["mon_data"] if self.p.mon_features else []
        if g.kind == "ctrl" and self.p.mon_features:
            dirs.append("mon_groups")
        return dirs

    def _info_tree(self) -> dict[str, dict[str, Callable[[], str]]]:
        p = self.p
        tree: dict[str, dict[str, Callable[[], str]]] = {}
        for s in self.l3_schemas:
            tree[s] = {
                "num_closids": lambda: str(p.l3_closids // (2 if p.cdp else 1)),
                "cbm_mask": lambda: f"{p.cbm_mask:x}",
                "min_cbm_bits": lambda: str(p.min_cbm_bits),
                "shareable_bits": lambda: f"{p.shareable_bits:x}",
                "bit_usage": lambda s=s: self._bit_usage(s),
                "sparse_masks": lambda: str(int(p.sparse_masks)),
            }
        if p.mb is not None:
            mb = p.mb
            tree["MB"] = {
                "min_bandwidth": lambda: str(mb.min_bandwidth),
                "bandwidth_gran": lambda: str(mb.bandwidth_gran),
                "delay_linear": lambda: str(mb.delay_linear),
                "thread_throttle_mode": lambda: mb.thread_throttle_mode,
                "num_closids": lambda: str(mb.num_closids),
            }
        if p.mon_features:
            tree["L3_MON"] = {
                "num_rmids": lambda: str(p.num_rmids),
                "mon_features": lambda: "\n".join(p.mon_features),
                "max_threshold_occupancy": lambda: str(p.max_threshold_occupancy),
            }
        return tree

    def kind(self, path: str) -> str | None:
        """``dir``, ``file``, ``wfile`` (writable file) or None when nothing is there."""
        with self.lock:
            parts = [x for x in path.split("/") if x]
            if not parts:
                return "dir"
            if parts[0] == "info":
                if len(parts) == 1:
                    return "dir"
                if parts[1:] == ["last_cmd_status"]:
                    return "file"
                tree = self._info_tree()
                if parts[1] not in tree:
                    return None
                if len(parts) == 2:
                    return "dir"
                return "file" if len(parts) == 3 and parts[2] in tree[parts[1]] else None
            found = self._resolve_group(parts)
            if found is None:
                return None
            g, rest = found
            if not rest:
                return "dir"
            if rest[0] in self._group_files(g) and len(rest) == 1:
                return "file" if rest[0] == "size" else "wfile"
            if rest == ["mon_groups"] and "mon_groups" in self._group_dirs(g):
                return "dir"
            if rest[0] == "mon_data" and "mon_data" in self._group_dirs(g):
                if len(rest) == 1:
                    return "dir"
                if rest[1] not in self._mon_dirs():
                    return None
                if len(rest) == 2:
                    return "dir"
                return "file" if len(rest) == 3 and rest[2] in self.p.mon_features else None
            return None

    def _mon_dirs(self) -> list[str]:
        return [f"mon_L3_{d:02d}" for d in self.domains]

    def listdir(self, path: str) -> list[str]:
        with self.lock:
            if self.kind(path) != "dir":
                raise ResctrlError(errno.ENOTDIR)
            parts = [x for x in path.split("/") if x]
            if not parts:
                g = self.root
                return ["info", *self._group_files(g), *self._group_dirs(g), *self.groups]
            if parts[0] == "info":
                tree = self._info_tree()
                if len(parts) == 1:
                    return ["last_cmd_status", *tree]
                return list(tree[parts[1]])
            g, rest = self._resolve_group(parts)  # type: ignore[misc]
            if not rest:
                return [*self._group_files(g), *self._group_dirs(g)]
            if rest == ["mon_groups"]:
                return list(g.mon_children)
            if len(rest) == 1:
                return self._mon_dirs()
            return list(self.p.mon_features)

    # ------------------------------------------------------------------ reads

    def read(self, path: str) -> str:
        with self.lock:
            kind = self.kind(path)
            if kind is None:
                raise ResctrlError(errno.ENOENT)
            if kind == "dir":
                raise ResctrlError(errno.EISDIR)
            parts = [x for x in path.split("/") if x]
            if parts[0] == "info":
                if parts[1] == "last_cmd_status":
                    return self.status + "\n"
                return self._info_tree()[parts[1]][parts[2]]() + "\n"
            g, rest = self._resolve_group(parts)  # type: ignore[misc]
            name = rest[0]
            if name == "tasks":
                return "".join(f"{pid}\n" for pid in sorted(self._tasks_of(g)))
            if name == "cpus":
                return format_mask(g.cpus, self.topo.possible) + "\n"
            if name == "cpus_list":
                return format_list(g.cpus) + "\n"
            if name == "schemata":
                return self._schemata_text(g)
            if name == "mode":
                return g.mode + "\n"
            if name == "size":
                return self._size_text(g)
            return self._read_counter(g, int(rest[1][len("mon_L3_") :]), rest[2]) + "\n"

    def _name_width(self) -> int:
        return self.rules.name_width(self.schemas, self.p.cdp_capable)

    def _schemata_text(self, g: Group) -> str:
        # rdtgroup_schemata_show / show_doms, with the padding of the emulated kernel.
        mb = self.p.mb
        width = self.rules.data_width(self.cbm_len, mb.data_width if mb is not None else None)
        lines = []
        for s in self.schemas:
            fmt = self.rules.format_bw if s == "MB" else self.rules.format_cbm
            vals = ";".join(fmt(d, v, width) for d, v in g.ctrl[s].items())
            lines.append(f"{s:>{self._name_width()}}:{vals}\n")
        return "".join(lines)

    def _size_text(self, g: Group) -> str:
        # rdtgroup_size_show: names padded, values never; a mask's size is
        # cache size / cbm_len * bits (rdtgroup_cbm_to_size divides first).
        lines = []
        for s in self.schemas:
            if s == "MB":
                vals = ";".join(f"{d}={v}" for d, v in g.ctrl[s].items())
            else:
                way = self.p.cache_size // self.cbm_len
                vals = ";".join(f"{d}={way * v.bit_count()}" for d, v in g.ctrl[s].items())
            lines.append(f"{s:>{self._name_width()}}:{vals}\n")
        return "".join(lines)

    def _bit_usage(self, schema: str) -> str:
        out = []
        for d in self.domains:
            chars = []
            for bit in reversed(range(self.cbm_len)):
                b = 1 << bit
                groups = self._ctrl_groups()
                excl = any(g.mode == "exclusive" and g.ctrl[schema][d] & b for g in groups)
                sw = any(g.mode == "shareable" and g.ctrl[schema][d] & b for g in groups)
                hw = bool(self.p.shareable_bits & b)
                # rdt_bit_usage_show's order of precedence
                code = "X" if hw and sw else "H" if hw else "S" if sw else "E" if excl else "0"
                chars.append(code)
            out.append(f"{d}={''.join(chars)}")
        return ";".join(out)

    # ------------------------------------------------------------------ tasks

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

    def _tasks_of(self, g: Group) -> set[int]:
        # show_rdt_tasks: every thread whose CLOSID is a control group's (so a control
        # group, the default one too, lists the tasks of its monitoring groups) or whose
        # RMID is a monitoring group's.
        gone = [t for t in self.task_group if not self._pid_alive(t)]
        if gone:
            self._advance()
        for tid in gone:
            del self.task_group[tid]  # exited tasks leave every group
        if g is self.root:
            return {
                t
                for t in self._threads()
                if self.task_group.get(t, self.root).ctrl_group is self.root
            }
        if g.kind == "ctrl":
            return {t for t, h in self.task_group.items() if h.ctrl_group is g}
        return {t for t, h in self.task_group.items() if h is g}

    def _write_tasks(self, g: Group, text: str) -> None:
        # rdtgroup_tasks_write. Before 6.7: one pid, parsed before the status is cleared.
        # From 6.7: comma-separated pids moved in turn; a failed move appends
        # "Error while processing task N" to its reason, and earlier moves stay.
        if not self.rules.multi_pid_tasks:
            pid = _kstrtoint(text.strip(" \t\n\v\f\r"))
            if pid is None or pid < 0:
                raise ResctrlError(errno.EINVAL)
            self.status = "ok"
            self._move_task(g, pid)
            return
        self.status = "ok"
        buf: str | None = text
        while buf and buf[0] not in "\0\n":
            pid_str, sep, rest = buf.partition(",")
            buf = rest if sep else None
            pid_str = pid_str.strip(" \t\n\v\f\r")
            pid = _kstrtoint(pid_str)
            if pid is None:
                self.status = f"Task list parsing error pid {pid_str}"
                raise ResctrlError(errno.EINVAL)
            if pid < 0:
                self.status = f"Invalid pid {pid}"
                raise ResctrlError(errno.EINVAL)
            try:
                self._move_task(g, pid)
            except ResctrlError:
                self.status += f"\nError while processing task {pid}"
                raise

    def _move_task(self, g: Group, tid: int) -> None:
        """rdtgroup_move_task for one thread id (writing a process's pid moves only its
        main thread: find_task_by_vpid finds that one task)."""
        if not self._pid_alive(tid):
            self.status = f"No task {tid}"
            raise ResctrlError(errno.ESRCH)
        if tid in self.denied:
            self.status = f"No permission to move task {tid}"
            raise ResctrlError(errno.EPERM)
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

    # ------------------------------------------------------------------ cpus

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

    # ------------------------------------------------------------------ mode

    def _write_mode(self, g: Group, text: str) -> None:
        if not text.endswith("\n"):
            raise ResctrlError(errno.EINVAL)
        self.status = "ok"
        want = text[:-1].strip()
        if want == g.mode:
            return
        if want == "shareable":
            g.mode = "shareable"
        elif want == "exclusive":
            if g is self.root:
                self.status = "Cannot change mode of the default group"
                raise ResctrlError(errno.EINVAL)
            for s in self.l3_schemas:
                for d in self.domains:
                    if self._overlaps(s, d, g.ctrl[s][d], g.closid, exclusive_only=False):
                        self.status = "Schemata overlaps"
                        raise ResctrlError(errno.EINVAL)
            g.mode = "exclusive"
        else:
            self.status = "Unknown or unsupported mode"
            raise ResctrlError(errno.EINVAL)

    # ------------------------------------------------------------------ schemata

    def _overlaps(self, schema: str, dom: int, cbm: int, closid: int, exclusive_only: bool) -> bool:
        # rdtgroup_cbm_overlaps: against every other CLOSID's current mask, and with CDP
        # against the peer (code vs data) masks too.
        for g in self._ctrl_groups():
            if g.closid == closid:
                continue
            if exclusive_only and g.mode != "exclusive":
                continue
            if any(g.ctrl[s][dom] & cbm for s in self.l3_schemas):
                return True
        return False

    def _write_schemata(self, g: Group, text: str) -> None:
        # rdtgroup_schemata_write: the trailing newline is checked before the status is
        # reset; then the whole write is parsed and staged before anything is applied.
        if not text or not text.endswith("\n"):
            raise ResctrlError(errno.EINVAL)
        self.status = "ok"
        staged: dict[str, dict[int, int]] = {}
        for line in text[:-1].split("\n"):
            resname, sep, rest = line.partition(":")
            resname = resname.strip()
            if not sep:
                self.status = "Missing ':'"
                raise ResctrlError(errno.EINVAL)
            if rest == "":
                self.status = f"Missing '{resname}' value"
                raise ResctrlError(errno.EINVAL)
            if resname not in self.schemas:
                self.status = f"Unknown or unsupported resource name '{resname}'"
                raise ResctrlError(errno.EINVAL)
            self._parse_line(g, resname, rest, staged.setdefault(resname, {}))
        self._advance()
        for schema, per_dom in staged.items():
            g.ctrl[schema].update(per_dom)

    def _parse_line(self, g: Group, schema: str, line: str, staged: dict[int, int]) -> None:
        for item in line.split(";"):
            if item == "":
                break  # the kernel stops at an empty token (e.g. a trailing ';')
            ident, sep, value = item.partition("=")
            if not sep or not ident.isdigit():
                self.status = "Missing '=' or non-numeric domain"
                raise ResctrlError(errno.EINVAL)
            dom = int(ident)
            value = value.strip()
            if dom not in self.domains:
                raise ResctrlError(errno.EINVAL)  # the kernel says nothing: status stays "ok"
            if dom in staged:
                self.status = f"Duplicate domain {dom}"
                raise ResctrlError(errno.EINVAL)
            staged[dom] = (
                self._parse_bw(value) if schema == "MB" else self._parse_cbm(g, schema, dom, value)
            )

    def _parse_bw(self, value: str) -> int:
        mb = self.p.mb
        assert mb is not None
        try:
            if not value.isdigit():
                raise ValueError
            bw = int(value, 10)
            if bw > 0xFFFFFFFF:
                raise ValueError
        except ValueError:
            self.status = f"Invalid MB value {value}"
            raise ResctrlError(errno.EINVAL) from None
        if self.p.mba_mbps:
            return bw
        if bw < mb.min_bandwidth or bw > mb.max_bandwidth:
            self.status = f"MB value {bw} out of range [{mb.min_bandwidth},{mb.max_bandwidth}]"
            raise ResctrlError(errno.EINVAL)
        gran = mb.bandwidth_gran
        return -(-bw // gran) * gran

    def _parse_cbm(self, g: Group, schema: str, dom: int, value: str) -> int:
        text = value[2:] if value[:2].lower() == "0x" else value
        if not text or any(c not in "0123456789abcdefABCDEF" for c in text):
            self.status = f"Non-hex character in the mask {value}"
            raise ResctrlError(errno.EINVAL)
        val = int(text, 16)
        if (self.p.min_cbm_bits > 0 and val == 0) or val > self.p.cbm_mask:
            self.status = "Mask out of range"
            raise ResctrlError(errno.EINVAL)
        first = (val & -val).bit_length() - 1 if val else self.cbm_len
        zero = first
        while zero < self.cbm_len and val >> zero & 1:
            zero += 1
        if not self.p.sparse_masks and val >> zero:
            self.status = f"The mask {val:x} has non-consecutive 1-bits"
            raise ResctrlError(errno.EINVAL)
        if zero - first < self.p.min_cbm_bits:
            self.status = f"Need at least {self.p.min_cbm_bits} bits in the mask"
            raise ResctrlError(errno.EINVAL)
        if self._overlaps(schema, dom, val, g.closid, exclusive_only=True):
            self.status = "Overlaps with exclusive group"
            raise ResctrlError(errno.EINVAL)
        if g.mode == "exclusive" and self._overlaps(schema, dom, val, g.closid, False):
            self.status = "Overlaps with other group"
            raise ResctrlError(errno.EINVAL)
        return val

    # ------------------------------------------------------------------ writes

    def write(self, path: str, data: bytes) -> int:
        """One write(2) to ``path``: one kernel command. Returns the bytes consumed."""
        with self.lock:
            kind = self.kind(path)
            if kind is None:
                raise ResctrlError(errno.ENOENT)
            if kind != "wfile":
                raise ResctrlError(errno.EACCES if kind == "file" else errno.EISDIR)
            try:
                text = data.decode()
            except UnicodeDecodeError:
                raise ResctrlError(errno.EINVAL) from None
            for i, (suffix, err, status) in enumerate(self.failures):
                if path.endswith(suffix):
                    del self.failures[i]
                    self.status = status
                    raise ResctrlError(err)
            parts = [x for x in path.split("/") if x]
            g, rest = self._resolve_group(parts)  # type: ignore[misc]
            name = rest[0]
            if name == "schemata":
                self._write_schemata(g, text)
            elif name == "tasks":
                self._write_tasks(g, text)
            elif name in ("cpus", "cpus_list"):
                self._write_cpus(g, text, as_list=name == "cpus_list")
            elif name == "mode":
                self._write_mode(g, text)
            return len(data)

    # ------------------------------------------------------------------ mkdir / rmdir

    def _alloc_rmid(self) -> int:
        now = self.clock()
        for entry in [e for e in self.limbo if e[0] <= now]:
            self.limbo.remove(entry)
            self.free_rmids.append(entry[1])
        if not self.free_rmids:
            self.status = "Out of RMIDs"
            raise ResctrlError(errno.EBUSY if self.limbo else errno.ENOSPC)
        return self.free_rmids.popleft()

    def _free_rmid(self, rmid: int) -> None:
        self.rmids.pop(rmid, None)
        if "llc_occupancy" in self.p.mon_features and self.p.limbo_s > 0:
            self.limbo.append((self.clock() + self.p.limbo_s, rmid))
        else:
            self.free_rmids.append(rmid)

    def _new_rmid_state(self, rmid: int) -> None:
        self.rmids[rmid] = Rmid(rmid, {d: 0 for d in self.domains}, {d: 0 for d in self.domains})

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
            if found is None or found[1] != ["mon_groups"] or not self.p.mon_features:
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
            self.status = "ok"
            self._advance()
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

    # ------------------------------------------------------------------ monitoring

    def _rates(self) -> dict[int, tuple[float, dict[int, float]]]:
        """Per RMID: bytes/s per domain and LLC footprint, from members, masks and MB."""
        if self._rates_cache is None:
            self._rates_cache = self._compute_rates()
        return self._rates_cache

    def _compute_rates(self) -> dict[int, tuple[float, dict[int, float]]]:
        members: dict[int, list[int]] = {}
        owner: dict[int, Group] = {}
        for g in self._ctrl_groups():
            owner[g.rmid] = g
            members.setdefault(g.rmid, [0, len(g.cpus)])
            for child in g.mon_children.values():
                owner[child.rmid] = child
                members.setdefault(child.rmid, [0, len(child.cpus)])
                members[g.rmid][1] -= len(child.cpus)
        for _pid, h in self.task_group.items():
            members.setdefault(h.rmid, [0, 0])[0] += 1
        # Tasks in the root group: not modelled (the whole system would dominate).
        out = {}
        for rmid, (ntasks, ncpus) in members.items():
            g = owner[rmid].ctrl_group
            demand = ntasks * TASK_BPS + max(0, ncpus) * CPU_BPS
            footprint = ntasks * TASK_FOOTPRINT + max(0, ncpus) * CPU_FOOTPRINT
            per_dom = {}
            for d in self.domains:
                frac = self._mask_of(g, d).bit_count() / self.cbm_len
                rate = demand * (1.5 - 0.5 * frac)  # fewer ways: more misses, more traffic
                if self.p.mb is not None:
                    mb = g.ctrl["MB"][d]
                    if self.p.mba_mbps:
                        rate = min(rate, mb * 1024 * 1024)
                    else:
                        rate *= max(mb, 1) / self.p.mb.max_bandwidth
                per_dom[d] = rate / len(self.domains)
            out[rmid] = (footprint, per_dom)
        return out

    def _mask_of(self, g: Group, dom: int) -> int:
        mask = 0
        for s in self.l3_schemas:
            mask |= g.ctrl[s][dom]
        return mask

    def _advance(self, mutating: bool = True) -> None:
        """Integrate every counter up to now at the current rates; a caller about to change
        what the rates depend on (tasks, CPUs, masks, groups) passes ``mutating``."""
        now = self.clock()
        dt = now - self.last_advance
        self.last_advance = now
        if dt > 0:
            self._integrate(dt)
        if mutating:
            self._rates_cache = None

    def _integrate(self, dt: float) -> None:
        for rmid, (_, per_dom) in self._rates().items():
            st = self.rmids.get(rmid)
            if st is None:
                continue
            for d, rate in per_dom.items():
                acc = st.carry.get(d, 0.0) + rate * dt
                whole = int(acc)
                st.carry[d] = acc - whole
                st.total[d] = (st.total[d] + whole) & U64
                st.local[d] = (st.local[d] + whole * 3 // 4) & U64

    def _read_counter(self, g: Group, dom: int, event: str) -> str:
        for key in ((g.rmid, event, dom), (g.rmid, event, None)):
            if key in self.overrides:
                return self.overrides[key]
        self._advance(mutating=False)
        rmids = [g.rmid] + [c.rmid for c in g.mon_children.values()]
        if event == "llc_occupancy":
            rates = self._rates()
            total = 0
            for r in rmids:
                footprint = rates.get(r, (0, {}))[0]
                total += footprint
            cap = self.p.cache_size * self._mask_of(g.ctrl_group, dom).bit_count() // self.cbm_len
            return str(min(total, cap) // 64 * 64)
        field_name = "total" if event == "mbm_total_bytes" else "local"
        return str(sum(getattr(self.rmids[r], field_name)[dom] for r in rmids) & U64)

    # ------------------------------------------------------------------ test hooks

    def _group_by_path(self, group_path: str) -> Group:
        found = self._resolve_group([x for x in group_path.split("/") if x])
        if found is None or found[1]:
            raise KeyError(f"no group at {group_path!r}")
        return found[0]

    def fail_next_write(self, path_suffix: str, err: int, status: str = "ok") -> None:
        """Make the next write to a path ending in ``path_suffix`` fail with ``err``,
        leaving ``status`` in last_cmd_status (a refusal the validator did not foresee)."""
        with self.lock:
            self.failures.append((path_suffix, err, status))

    def set_counter(
        self, group_path: str, event: str, value: str | None, domain: int | None = None
    ) -> None:
        """Make a counter read ``value`` (``Unavailable``, ``Error``, ``Unassigned``);
        None removes the override."""
        with self.lock:
            if value is not None and value not in COUNTER_SPECIALS:
                raise ValueError(f"counter value must be one of {COUNTER_SPECIALS}")
            key = (self._group_by_path(group_path).rmid, event, domain)
            if value is None:
                self.overrides.pop(key, None)
            else:
                self.overrides[key] = value

    def reset_counters(self, group_path: str) -> None:
        """Reset a group's MBM counters to zero (as a hardware/RMID reset would)."""
        with self.lock:
            self._advance()
            g = self._group_by_path(group_path)
            for r in [g.rmid] + [c.rmid for c in g.mon_children.values()]:
                self._new_rmid_state(r)

    def deny_task(self, pid: int) -> None:
        """Moving ``pid`` fails with EPERM (a task the writer may not move)."""
        with self.lock:
            self.denied.add(pid)


def _kstrtoint(text: str) -> int | None:
    """The kernel's kstrtoint(s, 0): optional sign, 0x hex / 0 octal / decimal, one
    optional trailing newline, and a value that fits an int; None where it fails."""
    body = text[:-1] if text.endswith("\n") else text
    sign = 1
    if body[:1] in "+-" and body:
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    if body[:2].lower() == "0x" and len(body) > 2:
        base, digits = 16, body[2:]
    elif body[:1] == "0" and len(body) > 1:
        base, digits = 8, body[1:]
    else:
        base, digits = 10, body
    allowed = {8: "01234567", 10: "0123456789", 16: "0123456789abcdefABCDEF"}[base]
    if not digits or any(c not in allowed for c in digits):
        return None
    value = sign * int(digits, base)
    return value if -(2**31) <= value < 2**31 else None

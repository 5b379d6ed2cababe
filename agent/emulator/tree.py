"""The emulated resctrl tree as files: which paths exist, directory listings, and reads
(schemata and size as the kernel prints them, info/ files, bit_usage).

Mirrors rdtgroup.c's file tables and show functions and ctrlmondata.c's schemata printing.
A part of :class:`~agent.emulator.model.Model`."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable

from agent.emulator.bitmap import format_list, format_mask
from agent.emulator.kernel import KernelRules
from agent.emulator.presets import Preset
from agent.emulator.state import Group, ResctrlError
from agent.emulator.topology import Topology


class TreeFiles:
    """Paths, listings and reads of the resctrl tree (a part of the Model)."""

    # The model's state (agent/emulator/model.py sets it up).
    p: Preset
    lock: threading.RLock
    status: str
    threshold: int
    root: Group
    groups: dict[str, Group]
    topo: Topology
    domains: list[int]
    cbm_len: int
    rules: KernelRules

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
            }
            if self.rules.has_sparse_masks_file:
                tree[s]["sparse_masks"] = lambda: str(int(p.sparse_masks))
        if p.mb is not None:
            mb = p.mb
            tree["MB"] = {
                "min_bandwidth": lambda: str(mb.min_bandwidth),
                "bandwidth_gran": lambda: str(mb.bandwidth_gran),
                "delay_linear": lambda: str(mb.delay_linear),
                "num_closids": lambda: str(mb.num_closids),
            }
            if mb.thread_throttle_mode is not None:
                tree["MB"]["thread_throttle_mode"] = lambda: mb.thread_throttle_mode
        if p.mon_features:
            tree["L3_MON"] = {
                "num_rmids": lambda: str(p.num_rmids),
                "mon_features": lambda: "\n".join(p.mon_features),
                "max_threshold_occupancy": lambda: str(self.threshold),
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
                if len(parts) != 3 or parts[2] not in tree[parts[1]]:
                    return None
                return "wfile" if parts[2] == "max_threshold_occupancy" else "file"
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

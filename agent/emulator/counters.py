"""Monitoring in the emulated resctrl tree: RMIDs (allocation, limbo after free) and the
counters behind ``mon_data`` (MBM bytes and LLC occupancy), integrated lazily from a
deterministic model of the groups' members, masks and MB values.

Mirrors monitor.c (RMID allocation, limbo, counter reads and their special values). A part
of :class:`~agent.emulator.model.Model`."""

from __future__ import annotations

import errno
import threading
from collections import deque
from collections.abc import Callable

from agent.emulator.presets import Preset
from agent.emulator.state import (
    COUNTER_SPECIALS,
    CPU_BPS,
    CPU_FOOTPRINT,
    TASK_BPS,
    TASK_FOOTPRINT,
    U64,
    Group,
    ResctrlError,
    Rmid,
)


class Counters:
    """RMIDs and monitoring counters (a part of the Model)."""

    # The model's state (agent/emulator/model.py sets it up).
    p: Preset
    lock: threading.RLock
    status: str
    root: Group
    groups: dict[str, Group]
    clock: Callable[[], float]
    domains: list[int]
    cbm_len: int
    task_group: dict[int, Group]
    free_rmids: deque[int]
    limbo: list[tuple[float, int]]
    rmids: dict[int, Rmid]
    last_advance: float
    overrides: dict[tuple[int, str, int | None], str]

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

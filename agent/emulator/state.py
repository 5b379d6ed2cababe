"""The emulated kernel's state: the refusal it raises, control and monitoring groups, RMIDs.

Shared by the parts of the emulator's :class:`~agent.emulator.model.Model` (file tree,
schemata, tasks and CPUs, monitoring counters), which read and change it under the model's
lock.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

U64 = (1 << 64) - 1
# What the kernel's strim()/strstrip() trim: isspace() of lib/ctype.c on ASCII (not the
# other characters str.strip() takes for whitespace, such as \x1c-\x1f).
KERNEL_SPACE = " \t\n\v\f\r"
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

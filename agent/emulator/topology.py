"""The CPU topology behind an emulated resctrl tree, and the sysfs files that expose it.

On a real host the resctrl domain ids are not free numbers: an L3 (and, on x86, MB) control
domain exists for each L3 cache id that has an online CPU, and its id is that cache's id
(arch/x86/kernel/cpu/resctrl/core.c ``domain_add_cpu``: ``get_domain_id_from_scope`` ->
``get_cpu_cacheinfo_id(cpu, 3)``), which user space reads from
``/sys/devices/system/cpu/cpuN/cache/index3/id``. Clients such as pqos build their domain
map from those files (intel-cmt-cat lib/os_cpuinfo.c) and, on Intel, from
``topology/physical_package_id`` (lib/cpuinfo.c uses the socket as the L3 CAT id), then
refuse a schemata whose ids they cannot place. So a preset's domains, its ``cpus`` masks
and the cache ids a client reads must come from one :class:`Topology`:

- :meth:`Topology.blocks` lays a preset's CPUs out in contiguous blocks, one per L3 domain;
  :meth:`Topology.write_sysfs` writes the matching ``/sys/devices/system/cpu`` tree, for a
  client started in a private mount namespace with that tree bind-mounted in place;
- :meth:`Topology.from_sysfs` reads the host's own topology, so an emulated tree can follow
  the host instead (``rdtune emulate-resctrl --host-topology``) and clients can read the
  real sysfs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agent.emulator.bitmap import format_list, format_mask, parse_list

SYSFS_CPU = "/sys/devices/system/cpu"


@dataclass(frozen=True)
class Topology:
    """Which CPUs exist and are online, and each CPU's L3 cache id and socket."""

    possible: int
    online: frozenset[int]
    l3_id: tuple[int, ...]  # indexed by CPU number, for every possible CPU
    socket: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.l3_id) != self.possible or len(self.socket) != self.possible:
            raise ValueError("l3_id and socket need one entry per possible CPU")
        if not self.online or max(self.online) >= self.possible:
            raise ValueError("online CPUs must be a non-empty subset of the possible ones")

    @property
    def domains(self) -> tuple[int, ...]:
        """L3 domain ids, ascending: the cache ids that have an online CPU (a domain
        appears when its first CPU comes online and goes with its last)."""
        return tuple(sorted({self.l3_id[c] for c in self.online}))

    def cpus_of(self, domain: int) -> frozenset[int]:
        return frozenset(c for c in self.online if self.l3_id[c] == domain)

    @classmethod
    def blocks(
        cls, online: int, possible: int, domains: tuple[int, ...], l3_per_socket: int = 1
    ) -> Topology:
        """CPUs 0..online-1 online; the possible CPUs split into one contiguous block per
        domain (the way firmware usually numbers them, package by package)."""
        n = len(domains)
        idx = [min(c * n // possible, n - 1) for c in range(possible)]
        return cls(
            possible=possible,
            online=frozenset(range(online)),
            l3_id=tuple(domains[i] for i in idx),
            socket=tuple(i // l3_per_socket for i in idx),
        )

    @classmethod
    def from_sysfs(cls, root: str = SYSFS_CPU) -> Topology:
        """The host's topology: ``possible``/``online`` and, per online CPU, its L3 id
        (``cache/index*/id`` of the level-3 entry; 0 without one) and package id."""
        possible = max(_read_list(os.path.join(root, "possible"))) + 1
        online = frozenset(_read_list(os.path.join(root, "online")))
        l3 = [0] * possible
        sock = [0] * possible
        for cpu in online:
            base = os.path.join(root, f"cpu{cpu}")
            sock[cpu] = _read_int(os.path.join(base, "topology", "physical_package_id"), 0)
            cache = os.path.join(base, "cache")
            for entry in sorted(os.listdir(cache)) if os.path.isdir(cache) else []:
                if (
                    entry.startswith("index")
                    and _read_int(os.path.join(cache, entry, "level"), 0) == 3
                ):
                    l3[cpu] = _read_int(os.path.join(cache, entry, "id"), 0)
        return cls(possible, online, tuple(l3), tuple(sock))

    def write_sysfs(self, dest: str, l3_size: int, l3_ways: int) -> None:
        """Write the files of ``/sys/devices/system/cpu`` that describe this topology
        (drivers/base/cpu.c, drivers/base/cacheinfo.c, drivers/base/topology.c formats):
        ``possible``, ``present``, ``online``, ``offline``, ``cpuN/online`` (not for
        CPU 0, which cannot go offline), and for online CPUs ``topology/*`` and
        ``cache/index{0,1,2,3}/*`` with one private L1d/L1i/L2 per CPU."""
        every = set(range(self.possible))
        files = {
            "possible": format_list(every),
            "present": format_list(every),
            "online": format_list(set(self.online)),
            "offline": format_list(every - self.online),
        }
        for cpu in range(self.possible):
            base = f"cpu{cpu}"
            if cpu:
                files[f"{base}/online"] = "1" if cpu in self.online else "0"
            if cpu not in self.online:
                continue  # an offline CPU has no topology or cache directories
            sharing = {c for c in self.online if self.l3_id[c] == self.l3_id[cpu]}
            siblings = {c for c in self.online if self.socket[c] == self.socket[cpu]}
            files[f"{base}/topology/physical_package_id"] = str(self.socket[cpu])
            files[f"{base}/topology/core_id"] = str(cpu)
            files[f"{base}/topology/die_id"] = "0"
            files[f"{base}/topology/core_cpus_list"] = str(cpu)
            files[f"{base}/topology/package_cpus_list"] = format_list(siblings)
            caches = [
                (1, "Data", cpu, {cpu}, 48 * 1024, 12),
                (1, "Instruction", cpu, {cpu}, 32 * 1024, 8),
                (2, "Unified", cpu, {cpu}, 1024 * 1024, 16),
                (3, "Unified", self.l3_id[cpu], sharing, l3_size, l3_ways),
            ]
            for i, (level, kind, cid, shared, size, ways) in enumerate(caches):
                d = f"{base}/cache/index{i}"
                files[f"{d}/level"] = str(level)
                files[f"{d}/type"] = kind
                files[f"{d}/id"] = str(cid)
                files[f"{d}/size"] = f"{size // 1024}K"
                files[f"{d}/ways_of_associativity"] = str(ways)
                files[f"{d}/coherency_line_size"] = "64"
                files[f"{d}/number_of_sets"] = str(max(1, size // (64 * ways)))
                files[f"{d}/shared_cpu_list"] = format_list(shared)
                files[f"{d}/shared_cpu_map"] = format_mask(shared, self.possible)
        for rel, text in files.items():
            path = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text + "\n")


def _read_list(path: str) -> set[int]:
    with open(path) as f:
        text = f.read()
    return parse_list(text, 1 << 16)


def _read_int(path: str, default: int) -> int:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return default

"""Machines the resctrl emulator can pretend to be (data only).

Values follow the resctrl facts of docs/EMULATOR.md (a typical Intel host, AMD units) and
the simulator's machine list (docs/SIMULATOR.md: Xeon Gold 6130: 11 ways, MBA 10-100 step
10; Xeon E5 v3: 20 ways, 4 CLOS, the Haswell quirk of at least 2 bits per mask; AMD EPYC
7002: 4 CLOS, MB as an absolute limit in 1/8 GB/s). Each preset names the kernel version
whose resctrl it emulates (agent/emulator/kernel.py) and lays its CPUs out in one block per
L3 domain (agent/emulator/topology.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from agent.emulator.kernel import KernelRules
from agent.emulator.topology import Topology

MBPS_DEFAULT = 4294967295  # MBA_MAX_MBPS: the default MB value in mba_MBps mode


@dataclass(frozen=True)
class MbPreset:
    min_bandwidth: int = 10
    bandwidth_gran: int = 10
    max_bandwidth: int = 100  # 100 (percent) or the AMD hardware limit (2048)
    num_closids: int = 8
    delay_linear: int = 1
    # None: no info/MB/thread_throttle_mode file (AMD: thread_throttle_mode_init returns
    # early for THREAD_THROTTLE_UNDEFINED)
    thread_throttle_mode: str | None = "max"
    data_width: int = 3  # schemata padding of MB values before 6.15: 3 on Intel, 4 on AMD


@dataclass(frozen=True)
class Preset:
    """One emulated machine.

    Attributes:
        cbm_mask: full capacity bitmask of the L3.
        l3_closids: hardware CLOSIDs of the L3 (halved for allocation when CDP is on).
        mb: memory bandwidth allocation, or None without MBA.
        cdp / mba_mbps: the mount options ``cdp`` and ``mba_MBps``.
        cpus_online / cpus_possible: CPUs 0..online-1 are online; up to possible-1 exist
            but are offline (writing them fails "Can only assign online CPUs").
        domains / l3_per_socket: L3 cache ids; the possible CPUs are split into one
            contiguous block per id, ``l3_per_socket`` blocks to a package.
        topology: an explicit CPU topology (e.g. the host's, ``Topology.from_sysfs()``);
            when set it replaces cpus_online, cpus_possible and domains.
        kernel: the kernel version whose resctrl this emulates (schemata padding, tasks
            parsing: agent/emulator/kernel.py).
        cdp_capable: the L3 supports CDP (cpuinfo flag ``cdp_l3``), which widens the
            schemata name column even while CDP is off.
        limbo_s: how long a freed RMID stays in limbo before it can be reused.
        mon_scale: bytes per unit of the occupancy counter (CPUID leaf 0xF's upscaling
            factor); ``info/L3_MON/max_threshold_occupancy`` is kept a multiple of it.
    """

    name: str
    description: str
    vendor: str = "GenuineIntel"
    model_name: str = "Intel(R) Xeon(R) CPU (emulated)"
    cbm_mask: int = 0xFFFFF
    min_cbm_bits: int = 1
    l3_closids: int = 16
    shareable_bits: int = 0
    sparse_masks: bool = False
    mb: MbPreset | None = field(default_factory=MbPreset)
    num_rmids: int = 192
    mon_features: tuple[str, ...] = ("llc_occupancy", "mbm_total_bytes", "mbm_local_bytes")
    max_threshold_occupancy: int = 1441792
    domains: tuple[int, ...] = (0,)
    cache_size: int = 40 * 1024 * 1024
    cpus_online: int = 8
    cpus_possible: int = 12
    l3_per_socket: int = 1
    topology: Topology | None = None
    cdp: bool = False
    cdp_capable: bool = True
    mba_mbps: bool = False
    kernel: str = "6.1"
    limbo_s: float = 0.2
    mon_scale: int = 64 * 1024

    def __post_init__(self) -> None:
        KernelRules.parse(self.kernel)  # a clear error for a bad version, at once

    @property
    def cbm_len(self) -> int:
        return self.cbm_mask.bit_length()

    @property
    def topo(self) -> Topology:
        if self.topology is not None:
            return self.topology
        return Topology.blocks(
            self.cpus_online, self.cpus_possible, self.domains, self.l3_per_socket
        )

    @property
    def rules(self) -> KernelRules:
        return KernelRules.parse(self.kernel)


_INTEL = Preset(
    name="intel-20way",
    description="Intel Xeon, 20-way L3, 16 CLOSIDs (MB: 8), MBA 10-100 step 10, 192 RMIDs, "
    "2 sockets; kernel 6.1",
    model_name="Intel(R) Xeon(R) Platinum 8180 CPU @ 2.50GHz (emulated)",
    shareable_bits=0xC0000,
    domains=(0, 1),
    cache_size=40 * 1024 * 1024,
    kernel="6.1",
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        _INTEL,
        Preset(
            name="gold-6130",
            description="Xeon Gold 6130 (CoPart): 11-way 22 MB L3, 16 CLOSIDs (MB: 8), "
            "MBA 10-100 step 10; kernel 6.15",
            model_name="Intel(R) Xeon(R) Gold 6130 CPU @ 2.10GHz (emulated)",
            cbm_mask=0x7FF,
            num_rmids=176,
            cache_size=22 * 1024 * 1024,
            cpus_online=16,
            cpus_possible=16,
            kernel="6.15",
        ),
        Preset(
            name="e5v3-4clos",
            description="Xeon E5 v3 (Haswell): 20-way 35 MB L3, 4 CLOSIDs, masks of >= 2 bits, "
            "no MBA; kernel 5.10",
            model_name="Intel(R) Xeon(R) CPU E5-2697 v3 @ 2.60GHz (emulated)",
            l3_closids=4,
            min_cbm_bits=2,
            mb=None,
            num_rmids=56,
            mon_features=("llc_occupancy",),
            cache_size=35 * 1024 * 1024,
            cpus_online=14,
            cpus_possible=16,
            cdp_capable=False,  # CDP came with Broadwell
            kernel="5.10",
        ),
        replace(
            _INTEL,
            name="intel-cdp",
            description="Intel 20-way host mounted with -o cdp (L3CODE/L3DATA, 8 CLOSIDs)",
            cdp=True,
        ),
        replace(
            _INTEL,
            name="intel-mbps",
            description="Intel 20-way host mounted with -o mba_MBps (MB in MiB/s)",
            mba_mbps=True,
        ),
        Preset(
            name="amd-epyc",
            description="AMD EPYC 7002: 4 CLOSIDs, 16-way L3 per CCX, MB limit in 1/8 GB/s "
            "(0..2048, step 1), 8 L3 domains; kernel 6.8",
            vendor="AuthenticAMD",
            model_name="AMD EPYC 7302P 16-Core Processor (emulated)",
            cbm_mask=0xFFFF,  # 16 MB, 16-way L3 per CCX: 1 MB per bit
            # rdt_init_res_defs_amd: masks need not be contiguous, and may be empty
            sparse_masks=True,
            min_cbm_bits=0,
            l3_closids=4,
            mb=MbPreset(
                min_bandwidth=0,
                bandwidth_gran=1,
                max_bandwidth=2048,
                num_closids=4,
                data_width=4,
                # __rdt_get_mem_config_amd: delay_linear false, throttle mode undefined
                delay_linear=0,
                thread_throttle_mode=None,
            ),
            num_rmids=256,
            domains=tuple(range(8)),
            l3_per_socket=8,  # one package, eight CCX L3s
            cache_size=16 * 1024 * 1024,
            cpus_online=16,
            cpus_possible=16,
            kernel="6.8",
            mon_scale=64,
        ),
    )
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}") from None

"""Discover NodeCapabilities from a resctrl tree (docs/RESCTRL.md, "Layout" and
"Mount").

Reads ``info/`` (L3 or L3CODE/L3DATA, MB, L3_MON), the root group's ``schemata`` (domain
ids), the control groups' ``cpus_list`` (together the online CPUs), and the mount options.
When the root is a real resctrl mount its options come from /proc/mounts (``cdp``,
``mba_MBps``); when it is not (the FUSE emulator, a copied tree) CDP is inferred from
``info/L3CODE`` and mba_MBps from the root group's MB default being above 100 on an
Intel-style MB resource.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agent.resctrl import schemata
from agent.types import (
    CacheCapabilities,
    MbaCapabilities,
    MbaMode,
    MonitoringCapabilities,
    NodeCapabilities,
    Vendor,
)

CACHE_SIZE = "/sys/devices/system/cpu/cpu0/cache/index3/size"
CPUINFO = "/proc/cpuinfo"
READ_SIZE = 65536


@dataclass(frozen=True)
class MountInfo:
    """How the resctrl root is mounted."""

    is_resctrl: bool
    options: frozenset[str] = frozenset()


def read_text(path: str) -> str:
    """A whole pseudo-file with plain read(2)s (no buffering, no fstat), the cheapest way
    through kernfs or FUSE. A short read is the end: seq_file fills the buffer unless it
    reached EOF, so small files cost one read instead of two."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, READ_SIZE):
            chunks.append(chunk)
            if len(chunk) < READ_SIZE:
                break
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def _read_int(path: str, base: int = 10) -> int:
    return int(read_text(path).strip(), base)


def mount_info(root: str, mounts: str = "/proc/mounts") -> MountInfo:
    """The mount entry for ``root`` (the last one wins, as in the kernel's view)."""
    real = os.path.realpath(root)
    found = MountInfo(False)
    try:
        text = read_text(mounts)
    except OSError:
        return found
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        target = fields[1].replace("\\040", " ")
        if os.path.realpath(target) == real:
            found = MountInfo(fields[2] == "resctrl", frozenset(fields[3].split(",")))
    return found


def parse_cpu_list(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in filter(None, text.strip().split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_cpu_list(cpus: set[int]) -> str:
    """``{0, 1, 2, 5}`` -> ``0-2,5`` (the kernel's cpus_list form)."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def control_group_texts(root: str, name: str) -> list[str]:
    """File ``name`` of every control group: the root's, then each group directory's
    (monitoring directories have none); a group removed while listed is skipped."""
    out = []
    for entry in ["", *(e for e in os.listdir(root) if e != "info")]:
        path = os.path.join(root, entry, name)
        if os.path.isfile(path):
            try:
                out.append(read_text(path))
            except OSError:
                continue
    return out


def online_cpus(root: str) -> set[int]:
    """The online CPUs: every one belongs to exactly one control group, so the union of
    their ``cpus_list`` files (the root's alone lacks the CPUs other groups took)."""
    cpus: set[int] = set()
    for text in control_group_texts(root, "cpus_list"):
        cpus |= parse_cpu_list(text)
    return cpus


def _largest_mb(root: str) -> int:
    """The largest MB value any control group holds. ``info/MB`` names no maximum (AMD's
    is a CPUID field, mba_MBps's the kernel's), and a group starts at it: the root group's
    alone would take an administrator's throttle of the default group for the maximum.
    Every group may be throttled, so on AMD this is only a floor: ResctrlNode learns the
    maximum from a group it makes (agent/resctrl/allocation.py)."""
    values: list[int] = []
    for text in control_group_texts(root, "schemata"):
        try:
            values += schemata.parse(text).resources.get("MB", {}).values()
        except schemata.SchemataError:
            continue  # not a group's schemata: the others stand
    return max(values, default=100)  # no MB line anywhere: percent mode's maximum


def parse_size(text: str) -> int | None:
    """``35840K`` -> bytes (sysfs cache size)."""
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
    digits = text.rstrip("KMG")
    return int(digits) * scale if digits.isdigit() else None


def cpu_vendor(cpuinfo: str = CPUINFO) -> tuple[Vendor | None, str]:
    """Vendor and model name from /proc/cpuinfo (None when it says neither Intel nor AMD)."""
    vendor, model = None, ""
    try:
        text = read_text(cpuinfo)
    except OSError:
        return None, ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "vendor_id" and vendor is None:
            vendor = {"GenuineIntel": Vendor.INTEL, "AuthenticAMD": Vendor.AMD}.get(value)
        elif key == "model name" and not model:
            model = value
    return vendor, model


def _cache(info: str, name: str, domains: tuple[int, ...], cdp: bool, size: int | None):
    d = os.path.join(info, name)
    sparse = os.path.join(d, "sparse_masks")
    shareable = os.path.join(d, "shareable_bits")
    return CacheCapabilities(
        cbm_mask=_read_int(os.path.join(d, "cbm_mask"), 16),
        min_cbm_bits=_read_int(os.path.join(d, "min_cbm_bits")),
        num_closids=_read_int(os.path.join(d, "num_closids")),
        domains=domains,
        shareable_bits=_read_int(shareable, 16) if os.path.exists(shareable) else 0,
        sparse_masks=bool(_read_int(sparse)) if os.path.exists(sparse) else False,
        cdp=cdp,
        size_bytes=size,
    )


def discover(
    root: str,
    mounts: str = "/proc/mounts",
    cache_size_path: str = CACHE_SIZE,
    cpuinfo: str = CPUINFO,
    pmc_events: frozenset[str] = frozenset(),
    pmc_unsupported: dict[str, str] | None = None,
) -> NodeCapabilities:
    """Capabilities of the resctrl tree at ``root``."""
    info = os.path.join(root, "info")
    if not os.path.isdir(info):
        raise FileNotFoundError(f"{root} is not a resctrl filesystem (no info/ directory)")
    mount = mount_info(root, mounts)
    root_schemata = schemata.parse(read_text(os.path.join(root, "schemata")))
    cpus = online_cpus(root)

    size = _size_from_root(root, root_schemata)
    if size is None and mount.is_resctrl and os.path.exists(cache_size_path):
        try:
            size = parse_size(read_text(cache_size_path))
        except OSError:
            size = None

    l3 = None
    if os.path.isdir(os.path.join(info, "L3CODE")):
        cdp = True
        if mount.is_resctrl and "cdp" not in mount.options:
            cdp = False  # a stale directory cannot override the mount: trust /proc/mounts
        doms = tuple(sorted(root_schemata.resources.get("L3DATA", {}))) or (0,)
        l3 = _cache(info, "L3DATA", doms, cdp, size)
    elif os.path.isdir(os.path.join(info, "L3")):
        doms = tuple(sorted(root_schemata.resources.get("L3", {}))) or (0,)
        l3 = _cache(info, "L3", doms, False, size)

    # The host's CPU describes the tree only when the tree is the host's resctrl mount.
    vendor, model = cpu_vendor(cpuinfo) if mount.is_resctrl else (None, "")
    mba = None
    mb_dir = os.path.join(info, "MB")
    if os.path.isdir(mb_dir):
        min_bw = _read_int(os.path.join(mb_dir, "min_bandwidth"))
        gran = _read_int(os.path.join(mb_dir, "bandwidth_gran"))
        mb_default = _largest_mb(root)
        amd_style = min_bw == 0 and gran == 1  # AMD: absolute limit in 1/8 GB/s
        if amd_style:
            vendor = Vendor.AMD  # only AMD's L3 QoS expresses MB this way
        if mount.is_resctrl:
            mbps = "mba_MBps" in mount.options
        else:
            mbps = not amd_style and mb_default > 100
        if mbps:
            mode, max_bw = MbaMode.MBPS, mb_default
        elif amd_style or vendor is Vendor.AMD:
            mode, max_bw = MbaMode.AMD, mb_default
        else:
            mode, max_bw = MbaMode.PERCENT, 100
        delay = os.path.join(mb_dir, "delay_linear")
        throttle = os.path.join(mb_dir, "thread_throttle_mode")
        mba = MbaCapabilities(
            min_bandwidth=min_bw,
            bandwidth_gran=gran,
            max_bandwidth=max_bw,
            num_closids=_read_int(os.path.join(mb_dir, "num_closids")),
            mode=mode,
            delay_linear=bool(_read_int(delay)) if os.path.exists(delay) else True,
            throttle_mode=_throttle_mode(throttle, vendor),
            domains=tuple(sorted(root_schemata.resources.get("MB", {0: 0}))),
        )

    monitoring = None
    mon_dir = os.path.join(info, "L3_MON")
    if os.path.isdir(mon_dir):
        features = frozenset(read_text(os.path.join(mon_dir, "mon_features")).split())
        thr = os.path.join(mon_dir, "max_threshold_occupancy")
        mon_doms = sorted(
            int(n[len("mon_L3_") :])
            for n in _listdir(os.path.join(root, "mon_data"))
            if n.startswith("mon_L3_") and n[len("mon_L3_") :].isdigit()
        )
        monitoring = MonitoringCapabilities(
            num_rmids=_read_int(os.path.join(mon_dir, "num_rmids")),
            features=features,
            max_threshold_occupancy=_read_int(thr) if os.path.exists(thr) else 0,
            domains=tuple(mon_doms) or (l3.domains if l3 else (0,)),
        )

    return NodeCapabilities(
        vendor=vendor or Vendor.INTEL,
        num_cpus=len(cpus) or (os.cpu_count() or 1),
        l3=l3,
        mba=mba,
        monitoring=monitoring,
        pmc_events=pmc_events,
        pmc_unsupported=pmc_unsupported or {},
        description=(f"resctrl at {root}" if mount.is_resctrl else f"resctrl tree at {root}")
        + (f" ({model})" if model else ""),
    )


def _size_from_root(root: str, held: schemata.Schemata) -> int | None:
    """Cache bytes per domain from the root group's ``size`` file (bytes its mask covers),
    scaled up to the full cache when the root's mask is not full."""
    try:
        sizes = schemata.parse(read_text(os.path.join(root, "size")), decimal=True)
        cbm = _read_int(
            os.path.join(
                root, "info", "L3DATA" if "L3DATA" in held.resources else "L3", "cbm_mask"
            ),
            16,
        )
    except (OSError, ValueError):
        return None
    for res in ("L3", "L3DATA"):
        for dom, nbytes in sizes.resources.get(res, {}).items():
            mask = held.get(res, dom)
            if mask:
                return nbytes * cbm.bit_count() // mask.bit_count()
    return None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _throttle_mode(path: str, vendor: Vendor) -> str:
    """``info/MB/thread_throttle_mode``; where the kernel lists none, "max" on Intel
    (kernels before 5.10, and MBA 1.0 parts, throttle a core at its threads' smallest
    value) and "" on AMD, whose limits are a class of service's, not a thread's
    (thread_throttle_mode_init leaves AMD's mode undefined)."""
    if os.path.exists(path):
        return read_text(path).strip()
    return "" if vendor is Vendor.AMD else "max"

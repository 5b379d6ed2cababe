"""Mount an emulated resctrl filesystem (``rdtune emulate-resctrl --preset NAME MOUNTPOINT``).

Try the real agent on any Linux machine with FUSE: the emulator behaves like the kernel's
/sys/fs/resctrl (groups, schemata rules and errors, tasks, CPUs, monitoring counters) of
one of several machines running a named kernel version. Point ResctrlNode at it, e.g.
``rdtune describe --root MOUNTPOINT`` or ``rdtune agent --backend resctrl --root
MOUNTPOINT``. Clients that also read the CPU topology (pqos) need domain ids that match it:
``--host-topology`` takes the host's CPUs and L3 ids, ``--cpu-sysfs DIR`` writes the
preset's own /sys/devices/system/cpu files to bind-mount for them (docs/EMULATOR.md). Runs
in the foreground; Ctrl-C (or ``fusermount3 -u MOUNTPOINT``) unmounts cleanly.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agent.emulator.presets import PRESETS

    parser.add_argument(
        "--preset",
        default="intel-20way",
        choices=sorted(PRESETS),
        help="machine to emulate (default intel-20way; see --list-presets)",
    )
    parser.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    parser.add_argument(
        "--kernel",
        metavar="VERSION",
        help="emulate this kernel version's resctrl (e.g. 6.1, 6.15) instead of the preset's: "
        "schemata padding and line order, tasks parsing (one pid, or a list from 6.7), "
        "monitoring groups renamed across control groups (from 6.5), info/L3/sparse_masks "
        "(from 6.7); docs/EMULATOR.md lists each",
    )
    topo = parser.add_mutually_exclusive_group()
    topo.add_argument(
        "--host-topology",
        action="store_true",
        help="take the CPUs (online, possible) and L3 domain ids from this host's "
        "/sys/devices/system/cpu, so clients reading the real sysfs see matching domains",
    )
    topo.add_argument(
        "--cpu-sysfs",
        metavar="DIR",
        help="also write the preset's /sys/devices/system/cpu files (online CPUs, cache ids, "
        "packages) into DIR, to bind-mount over /sys/devices/system/cpu for a client",
    )
    parser.add_argument(
        "mountpoint", nargs="?", help="an existing empty directory to mount the tree on"
    )


def run(args: argparse.Namespace) -> int:
    import os
    import sys

    from agent.emulator.presets import PRESETS

    if args.list_presets:
        for name, p in PRESETS.items():
            print(f"{name:12s} {p.description}")
        return 0
    if not args.mountpoint:
        print("rdtune emulate-resctrl: give a MOUNTPOINT (or --list-presets)", file=sys.stderr)
        return 2
    if not os.path.isdir(args.mountpoint):
        print(f"rdtune emulate-resctrl: {args.mountpoint} is not a directory", file=sys.stderr)
        return 2
    if os.path.ismount(args.mountpoint):
        print(f"rdtune emulate-resctrl: {args.mountpoint} is already a mount", file=sys.stderr)
        return 2
    if not os.path.exists("/dev/fuse"):
        print(
            "rdtune emulate-resctrl: /dev/fuse is missing (load the fuse module, install fuse3)",
            file=sys.stderr,
        )
        return 1
    from agent.emulator.fs import mount
    from agent.emulator.model import Model

    try:
        preset = configure(args)
    except (OSError, ValueError) as exc:
        print(f"rdtune emulate-resctrl: {exc}", file=sys.stderr)
        return 2
    model = Model(preset)
    print(
        f"emulating {args.preset} ({preset.description}) with the resctrl of Linux "
        f"{preset.rules}, L3 domains {list(model.domains)}, at "
        f"{os.path.abspath(args.mountpoint)}; Ctrl-C to unmount",
        file=sys.stderr,
    )
    try:
        mount(model, args.mountpoint)  # returns when unmounted (Ctrl-C or fusermount3 -u)
    except RuntimeError as exc:
        print(f"rdtune emulate-resctrl: mounting failed: {exc}", file=sys.stderr)
        return 1
    return 0


def configure(args: argparse.Namespace):
    """The preset with the command line's kernel and topology choices applied; writes the
    ``--cpu-sysfs`` tree."""
    from dataclasses import replace

    from agent.emulator.presets import PRESETS
    from agent.emulator.topology import Topology

    preset = PRESETS[args.preset]
    if args.kernel:
        preset = replace(preset, kernel=args.kernel)
    if args.host_topology:
        preset = replace(preset, topology=Topology.from_sysfs())
    if args.cpu_sysfs:
        preset.topo.write_sysfs(args.cpu_sysfs, preset.cache_size, preset.cbm_len)
    return preset

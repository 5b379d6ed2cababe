"""Mount an emulated resctrl filesystem (``rdtune emulate-resctrl --preset NAME MOUNTPOINT``).

Try the real agent on any Linux machine with FUSE: the emulator behaves like the kernel's
/sys/fs/resctrl (groups, schemata rules and errors, tasks, CPUs, monitoring counters) for
one of several machines. Point ResctrlNode at it, e.g. ``rdtune describe --root
MOUNTPOINT`` or ``rdtune agent --backend resctrl --root MOUNTPOINT``. Runs in the
foreground; Ctrl-C (or ``fusermount3 -u MOUNTPOINT``) unmounts cleanly.
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

    model = Model(PRESETS[args.preset])
    print(
        f"emulating {args.preset} ({PRESETS[args.preset].description}) at "
        f"{os.path.abspath(args.mountpoint)}; Ctrl-C to unmount",
        file=sys.stderr,
    )
    try:
        mount(model, args.mountpoint)  # returns when unmounted (Ctrl-C or fusermount3 -u)
    except RuntimeError as exc:
        print(f"rdtune emulate-resctrl: mounting failed: {exc}", file=sys.stderr)
        return 1
    return 0

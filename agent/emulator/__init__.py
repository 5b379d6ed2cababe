"""An emulated resctrl filesystem (FUSE) that behaves like the kernel's (docs/EMULATOR.md).

``model`` is a pure-Python model of fs/resctrl, written independently of ResctrlNode and
agent/validate.py so a bug in one is not hidden by the other, composed of its parts:
``state`` (groups, RMIDs), ``tree`` (paths and reads), ``schemata`` (schemata and mode
writes), ``tasks`` (tasks and CPUs) and ``counters`` (monitoring); ``fs`` exposes it over FUSE;
``presets`` holds the machines it can pretend to be; ``kernel`` what changed between the
kernel versions they name; ``bitmap`` the kernel's CPU mask/list formats; ``topology`` the
CPUs and L3 ids behind the domains (and the sysfs files that show them); ``cli`` is
``rdtune emulate-resctrl``.
"""

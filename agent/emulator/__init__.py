"""An emulated resctrl filesystem (FUSE) that behaves like the kernel's (RESCTRL.md).

``model`` is a pure-Python model of fs/resctrl, written independently of ResctrlNode and
agent/validate.py so a bug in one is not hidden by the other; ``fs`` exposes it over FUSE;
``presets`` holds the machines it can pretend to be; ``cli`` is ``rdtune emulate-resctrl``.
"""

"""The real Linux resctrl backend: ResctrlNode and its pieces (schemata parsing, capability
discovery, flock, monitoring counters, ownership state). See docs/RESCTRL.md."""

from agent.resctrl.node import ResctrlNode

__all__ = ["ResctrlNode"]

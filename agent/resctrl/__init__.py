"""The real Linux resctrl backend: ResctrlNode and its pieces (schemata parsing, capability
discovery, flock, monitoring counters, ownership state). See shared/design/RESCTRL.md."""

from agent.resctrl.node import ResctrlNode

__all__ = ["ResctrlNode"]

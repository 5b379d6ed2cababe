"""The real Linux resctrl backend: ResctrlNode (node.py, with its parts ownership.py,
recovery.py, tasks.py, allocation.py, observe.py) and its pieces (schemata parsing,
capability discovery, flock, monitoring counters, ownership state). See docs/RESCTRL.md."""

from agent.resctrl.node import ResctrlNode

__all__ = ["ResctrlNode"]

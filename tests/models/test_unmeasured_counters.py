"""A count the node could not measure in one interval (NaN: a multiplexed PMC event that
never ran) must not leave the controllers that learn from counters worse for the rest of
the run: its interval is skipped, as one with None counters is."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from agent.sim import SimNode
from agent.types import Snapshot
from models.controller import carry_out, context
from models.ubik import Ubik
from models.ucp import UcpStyle


def _unmeasured(snap: Snapshot) -> Snapshot:
    nan = math.nan
    groups = {
        g: replace(s, instructions=nan, cycles=nan, llc_references=nan, llc_misses=nan)
        for g, s in snap.groups.items()
    }
    return Snapshot(snap.timestamp, snap.interval_s, groups)


def _run(controller, nan_at: int | None, intervals: int = 200) -> dict[str, int]:
    node = SimNode("lc_batch_20", seed=2, noise=False)
    carry_out(node, controller.start(context(node)))
    node.observe()
    for i in range(1, intervals + 1):
        node.advance(0.1)
        snap = node.observe()
        if i == nan_at:
            snap = _unmeasured(snap)
        carry_out(node, controller.decide(snap, context(node, time_s=node.now())))
    return {g: next(iter(a.values())).ways for g, a in node.allocation().groups.items()}


def _numbers(obj, seen=None) -> list[float]:
    """Every float in a controller's state (its attributes, recursively)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, float):
        return [obj]
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _numbers(v, seen)]
    if isinstance(obj, list | tuple | set):
        return [x for v in obj for x in _numbers(v, seen)]
    if hasattr(obj, "__dict__") and type(obj).__module__.startswith("models"):
        return [x for v in vars(obj).values() for x in _numbers(v, seen)]
    return []


@pytest.mark.parametrize(
    "make", [lambda: Ubik({"masstree": 4, "xapian": 3}), UcpStyle], ids=["ubik", "ucp"]
)
def test_one_unmeasured_interval_changes_nothing(make) -> None:
    clean = _run(make(), None)
    controller = make()
    assert _run(controller, 50) == clean
    state = _numbers(controller)
    assert state and not any(math.isnan(x) for x in state)

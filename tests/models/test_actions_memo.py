"""ActionDecoder's prepared context: memoised splits and directly built plans are what the
plain computation gives, and callers get fresh dicts."""

from __future__ import annotations

import numpy as np
import pytest

from agent.types import AllocationPlan
from models.actions import ActionDecoder, _same_form
from tests.models.test_features_pinned import _capabilities


@pytest.mark.parametrize("caps", _capabilities(), ids=lambda c: str(c.vendor) + str(c.l3)[:20])
def test_plans_are_the_constructors_plans(caps) -> None:
    dec = ActionDecoder(max_groups=6)
    rng = np.random.default_rng(0)
    slots = [f"g{i}" for i in range(5)]
    for _ in range(200):
        a = np.concatenate([rng.integers(0, 8, 6), rng.integers(0, 10, 6)])
        d = dec.decode(a, slots, caps)
        again = ActionDecoder(max_groups=6).decode(a.tolist(), slots, caps)  # a cold decoder
        assert d == again
        plan = d.plan
        assert type(plan) is AllocationPlan and plan == AllocationPlan(plan.groups)
        assert _same_form(plan, AllocationPlan(plan.groups)) and repr(plan) == repr(again.plan)
    # The direct form was checked against the constructor's and is in use (a node with
    # nothing to allocate has empty plans only: nothing to check).
    direct = type(AllocationPlan({"x": {}}).groups) if caps.l3 or caps.mba else None
    assert dec._context(slots, caps)._wrap is direct


def test_returned_dicts_are_the_callers() -> None:
    caps = _capabilities()[0]
    dec = ActionDecoder(max_groups=4)
    a = np.array([1, 2, 3, 0, 4, 5, 6, 0])
    first = dec.decode(a, ["x", "y", "z"], caps)
    first.ways["x"] = 99
    first.masks.clear()
    first.mb["y"] = -1
    second = dec.decode(a, ["x", "y", "z"], caps)
    assert second.ways["x"] != 99 and second.masks and second.mb["y"] > 0
    assert second == ActionDecoder(max_groups=4).decode(a, ["x", "y", "z"], caps)


def test_a_new_node_or_group_set_gets_a_new_context() -> None:
    intel, amd = _capabilities()[:2]
    dec = ActionDecoder(max_groups=4)
    a = np.array([1, 2, 3, 0, 4, 5, 6, 0])
    for caps, slots in [(intel, ["x", "y"]), (amd, ["x", "y"]), (amd, ["x", "y", "z"])]:
        assert dec.decode(a, slots, caps) == ActionDecoder(max_groups=4).decode(a, slots, caps)


def test_an_action_of_any_shape_is_read_flat() -> None:
    caps = _capabilities()[0]
    a = np.array([1, 2, 3, 0, 4, 5, 6, 0])
    flat = ActionDecoder(max_groups=4).decode(a, ["x", "y"], caps)
    assert ActionDecoder(max_groups=4).decode(a.reshape(2, 4), ["x", "y"], caps) == flat
    assert ActionDecoder(max_groups=4).decode(a[::-1][::-1], ["x", "y"], caps) == flat
    with pytest.raises(ValueError, match="8"):
        ActionDecoder(max_groups=4).decode(np.array(3), ["x", "y"], caps)

"""UCP as a whole-node policy (models/ucp.py); its Lookahead and miss curves are tested
with Ubik's batch space (tests/models/test_ubik.py), its driving with the catalogue's."""

from __future__ import annotations

import dataclasses

import pytest

from agent.sim import SimNode
from agent.types import GroupSpec
from models.controller import ControlContext
from models.ucp import UcpStyle


def test_ucp_refuses_more_groups_than_the_cache_has_way_slots_for() -> None:
    """Eleven groups of at least two ways on a 20-way cache: it said only that a packing
    of ways did not fit."""
    node = SimNode("default", 0)
    caps = node.capabilities()
    l3 = dataclasses.replace(caps.l3, cbm_mask=(1 << 20) - 1, min_cbm_bits=2, num_closids=16)
    groups = {f"b{i}": GroupSpec(f"b{i}") for i in range(11)}
    ctx = ControlContext(dataclasses.replace(caps, l3=l3), groups, node.allocation())
    with pytest.raises(ValueError, match=r"11 groups of at least 2 way\(s\) do not fit in 20 ways"):
        UcpStyle().start(ctx)

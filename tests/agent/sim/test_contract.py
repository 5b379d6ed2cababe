"""The Node contract on SimNode, over every machine preset."""

from __future__ import annotations

import numpy as np
import pytest

from agent.node import Clock, GroundTruth, Node, as_clock, ground_truth, twin
from agent.sim import SimNode
from agent.sim.catalog import default_catalog
from agent.sim.scenario import Scenario, WorkloadInstance
from tests.agent.contract import NodeContract, NodeHarness

PRESETS = sorted(default_catalog().machines)


def _scenario(machine: str) -> Scenario:
    return Scenario(
        name=f"contract-{machine}",
        machine=machine,
        workloads=(
            WorkloadInstance("kv", "memcached", threads=2),
            WorkloadInstance("cg", "CG", threads=2),
        ),
    )


class TestSimNodeContract(NodeContract):
    @pytest.fixture(params=PRESETS)
    def harness(self, request) -> NodeHarness:
        node = SimNode(_scenario(request.param), seed=1, auto_groups=False)
        pids = [p for w in node.workloads() for p in w.pids]
        return NodeHarness(node=node, pids=pids, unknown_pid=999_999, tick=node.advance)


def test_simnode_is_a_node_and_a_clock() -> None:
    node = SimNode()
    assert isinstance(node, Node)
    assert isinstance(node, Clock)
    assert as_clock(node) is node


def test_simnode_offers_ground_truth_and_its_twin_continues_as_it_would() -> None:
    node = SimNode("default", seed=4)
    assert isinstance(node, GroundTruth) and ground_truth(node) is node
    node.advance(0.5)
    copy = twin(node)
    node.advance(0.3)
    copy.advance(0.3)
    a, b = node.observe(), copy.observe()
    assert a.timestamp == b.timestamp
    for g, s in a.groups.items():
        assert (s.instructions, s.llc_misses) == (b.groups[g].instructions, b.groups[g].llc_misses)
    copy.close()


def _readings(node: SimNode) -> list[tuple]:
    """Half a second of the node: each group's counters and LC requests, as observed."""
    node.advance(0.5)
    snap = node.observe()
    return [
        (s.instructions, s.llc_misses, s.latency.count if s.latency else None)
        for _, s in sorted(snap.groups.items())
    ]


def test_a_reseeded_twin_holds_the_same_state_and_draws_another_future() -> None:
    """twin(seed=...): the state of now (time, occupancy), the noise and requests of other
    streams from now on, the same ones for the same seed."""
    node = SimNode("copart_memcached", seed=4)
    node.advance(1.0)
    node.observe()
    same = twin(node)
    other, again = twin(node, seed=(4, 1)), twin(node, seed=(4, 1))
    held, copied = node.occupancy(), other.occupancy()
    assert other.now() == node.now() and held.keys() == copied.keys()
    assert all(np.array_equal(held[k], copied[k]) for k in held)
    expected = _readings(node)
    assert _readings(same) == expected
    drawn = _readings(other)
    assert drawn != expected and _readings(again) == drawn
    for copy in (same, other, again):
        copy.close()

"""The Node contract on SimNode, over every machine preset."""

from __future__ import annotations

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

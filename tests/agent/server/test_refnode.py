"""The reference node passes the Node contract locally (so it is a fair stand-in)."""

from __future__ import annotations

import os

import pytest

from tests.agent.contract import NodeContract, NodeHarness
from tests.agent.server.refnode import RefNode


class TestRefNodeContract(NodeContract):
    @pytest.fixture
    def harness(self) -> NodeHarness:
        node = RefNode()
        return NodeHarness(node=node, pids=[os.getpid()], unknown_pid=2**22 + 7, tick=node.tick)

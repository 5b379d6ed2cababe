"""The Node contract through RemoteNode, against a real agent on loopback TCP and a Unix
socket, for every backend available: the reference node, SimNode and ResctrlNode on the
FUSE resctrl emulator (these two run as soon as their packages exist)."""

from __future__ import annotations

import os

import pytest

from agent.node import as_clock
from tests.agent.contract import NodeContract, NodeHarness
from tests.agent.server.conftest import remote, serve
from tests.agent.server.refnode import RefNode


class TestRemoteRefNode(NodeContract):
    @pytest.fixture
    def harness(self, transport):
        node = RefNode()
        with serve(node, unix=transport == "unix") as server, remote(server) as client:
            yield NodeHarness(client, pids=[os.getpid()], unknown_pid=2**22 + 7, tick=node.tick)

    def test_real_node_has_no_clock(self, node) -> None:
        assert as_clock(node) is None

"""ResctrlNode passes the Node contract on every emulator preset (real FUSE mount, real
child processes as tasks, wall-clock time)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.agent.contract import NodeContract, NodeHarness
from tests.agent.resctrl.conftest import make_node, unknown_pid
from tests.emulated_resctrl import Emulated


class TestResctrlNodeContract(NodeContract):
    @pytest.fixture
    def harness(self, emu: Emulated, children: list[int]) -> Iterator[NodeHarness]:
        node = make_node(emu)
        try:
            yield NodeHarness(node, children, unknown_pid(), time.sleep)
        finally:
            node.close()

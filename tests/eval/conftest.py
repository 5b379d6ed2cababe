"""Fixtures of the evaluation tests: a real gRPC agent serving a SimNode on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent.server.app import AgentServer
from agent.server.config import AgentConfig


@pytest.fixture
def agent_address() -> Iterator[str]:
    from agent.sim import SimNode

    node = SimNode("default", 0)
    server = AgentServer(
        node, AgentConfig(listen="127.0.0.1:0", metrics_listen="", grace_s=1.0), own_node=True
    ).start()
    try:
        yield server.address
    finally:
        server.stop()

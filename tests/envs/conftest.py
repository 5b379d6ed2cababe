"""Shared fixtures: small, fast Partition-v0 instances and a real agent on loopback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import gymnasium as gym
import pytest

import envs
from agent.server.app import AgentServer
from agent.server.config import AgentConfig

# Short episodes and intervals keep the suite fast; semantics are the same as the defaults.
FAST = {"episode_steps": 6, "interval_s": 0.5}


@pytest.fixture
def make_env():
    """``make_env(**kwargs)`` -> a gymnasium.make'd Partition-v0 (closed after the test)."""
    made: list[gym.Env] = []

    def make(env_id: str = envs.PARTITION_ID, **kwargs) -> gym.Env:
        env = gym.make(env_id, **{**FAST, **kwargs})
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()


@contextlib.contextmanager
def agent_on_loopback(scenario: str = "default", seed: int = 3) -> Iterator[AgentServer]:
    """A real gRPC agent serving a SimNode on 127.0.0.1 (port chosen by the kernel)."""
    from agent.sim import SimNode

    node = SimNode(scenario, seed)
    server = AgentServer(
        node, AgentConfig(listen="127.0.0.1:0", metrics_listen="", grace_s=1.0), own_node=True
    ).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def agent_address() -> Iterator[str]:
    with agent_on_loopback() as server:
        yield server.address

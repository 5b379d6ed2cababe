"""RemotePartition-v0 against a real gRPC agent on loopback (a SimNode served in-process)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import envs
from agent.client import RemoteNode
from agent.sim import SimNode
from envs.partition import NodePartitionEnv


def test_checkers_pass_over_a_real_agent(make_env, agent_address) -> None:
    env = make_env(envs.REMOTE_PARTITION_ID, address=agent_address, scenario="default")
    check_env(env.unwrapped, skip_render_check=False)
    sb3_check_env(env.unwrapped)


def test_simulated_remote_rewinds_its_clock_and_is_reproducible(make_env, agent_address):
    env = make_env(envs.REMOTE_PARTITION_ID, address=agent_address, scenario="default")

    def rollout(seed):
        obs, info = env.reset(seed=seed)
        assert env.unwrapped.node.now() == pytest.approx(0.5)  # rewound, one interval run
        out = [obs]
        rng = np.random.default_rng(seed)
        for _ in range(3):
            obs, reward, *_ = env.step(rng.integers(0, env.action_space.nvec))
            out.append(obs)
            out.append(reward)
        return out, info

    a, info = rollout(7)
    b, _ = rollout(7)
    assert info["slots"] == ["memcached", "ocean_cp", "swaptions", "water_nsquared"]
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_remote_and_local_envs_agree_on_the_same_node_state(agent_address) -> None:
    """The same actions through the agent and on an in-process node (same seed) give the
    same observations: the env sees the remote node exactly as a local one."""
    remote = NodePartitionEnv(address=agent_address, scenario="default", interval_s=0.5)
    local_node = SimNode("default", 0)
    local = NodePartitionEnv(node=local_node, scenario="default", interval_s=0.5)
    try:
        ra, _ = remote.reset(seed=3)
        la, _ = local.reset(seed=3)
        assert np.allclose(ra, la, atol=1e-6)
        action = np.array([5, 1, 2, 3, 0, 0, 0, 0, 9, 4, 6, 2, 0, 0, 0, 0])
        ro, rr, *_ = remote.step(action)
        lo, lr, *_ = local.step(action)
        assert np.allclose(ro, lo, atol=1e-6) and rr == pytest.approx(lr, abs=1e-6)
        assert remote.held_allocation == local.held_allocation
    finally:
        remote.close()
        local.close()
    assert not local_node._closed  # a node passed in is the caller's to close


def test_wall_clock_steps_reapply_the_baseline(agent_address) -> None:
    """Without the clock, steps take real time and reset only re-applies the baseline."""
    env = NodePartitionEnv(address=agent_address, use_clock=False, interval_s=0.05, episode_steps=3)
    client = RemoteNode(agent_address)
    try:
        env.reset(seed=0)
        t0 = client.now()
        env.step(env.action_space.sample())
        _, _info = env.reset(seed=1, options={"baseline": "full"})
        assert client.now() == t0  # simulated time never moved: nothing rewound or advanced
        caps = client.capabilities()
        held = client.allocation()
        assert {held.get(g, 0).l3_mask for g in held} == {caps.l3.cbm_mask}
        assert env.unwrapped.last_snapshot.interval_s == 0.0  # no simulated time passed
        obs, reward, *_ = env.step(env.action_space.sample())
        assert obs in env.observation_space and np.isfinite(reward)
    finally:
        env.close()
        client.close()


def test_groups_changed_on_the_node_are_picked_up(agent_address) -> None:
    env = NodePartitionEnv(address=agent_address, scenario="default", interval_s=0.2)
    client = RemoteNode(agent_address)
    try:
        env.reset(seed=0)
        assert "water_nsquared" in env.slots
        client.delete_group("water_nsquared")
        _, _, _, _, info = env.step(env.action_space.sample())
        assert "water_nsquared" not in info["slots"] and len(info["slots"]) == 3
    finally:
        env.close()
        client.close()


def test_gym_make_passes_connection_settings(agent_address) -> None:
    env = gym.make(envs.REMOTE_PARTITION_ID, address=agent_address, timeout=3.0)
    try:
        assert env.unwrapped.node.timeout == 3.0
    finally:
        env.close()

"""Vectorised construction and SB3 smoke runs (PPO and MaskablePPO, Dummy and Subproc)."""

from __future__ import annotations

import numpy as np
import pytest
from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.utils import get_action_masks
from stable_baselines3 import PPO

from envs.vector import (
    env_creator,
    make_batched_vec_env,
    make_gym_vec_env,
    make_sb3_vec_env,
    per_env_infos,
)

SMALL = {"episode_steps": 8, "interval_s": 0.5, "max_groups": 4}


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny MLPs gain nothing from threads, and on a shared 2-core machine torch's worker
    threads spin against other processes (the smoke runs took 10x longer with them)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _check_masked_predictions(model, vec) -> None:
    obs = vec.reset()
    masks = get_action_masks(vec)  # through env_method("action_masks")
    assert masks.shape == (vec.num_envs, int(vec.action_space.nvec.sum()))
    action, _ = model.predict(obs, action_masks=masks, deterministic=True)
    # Masked choices are never taken: absent slots stay at level 0.
    nvec = vec.action_space.nvec
    offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
    assert masks[np.arange(vec.num_envs)[:, None], offsets + action].all()


@pytest.mark.parametrize("subproc", [False, True])
def test_ppo_and_maskable_ppo_learn_briefly_on_an_sb3_vec_env(subproc: bool) -> None:
    """DummyVecEnv, and SubprocVecEnv where masks come from the env itself in the worker
    processes."""
    vec = make_sb3_vec_env(2, seed=2 if subproc else 1, subproc=subproc, **SMALL)
    try:
        PPO("MlpPolicy", vec, n_steps=32, batch_size=32, n_epochs=1, seed=0).learn(64)
        model = MaskablePPO("MlpPolicy", vec, n_steps=32, batch_size=32, n_epochs=1, seed=0)
        model.learn(total_timesteps=64)
        _check_masked_predictions(model, vec)
    finally:
        vec.close()


def test_sb3_vec_env_terminal_observation_and_seeding() -> None:
    vec = make_sb3_vec_env(2, seed=5, **{**SMALL, "episode_steps": 2})
    again = make_sb3_vec_env(2, seed=5, **{**SMALL, "episode_steps": 2})
    try:
        o1, o2 = vec.reset(), again.reset()
        assert np.array_equal(o1, o2) and not np.array_equal(o1[0], o1[1])
        actions = np.zeros((2, vec.action_space.nvec.size), dtype=np.int64)
        vec.step(actions)
        _, _, dones, infos = vec.step(actions)
        assert dones.all() and all("terminal_observation" in i for i in infos)
        assert all("reward_terms" in i for i in infos)
    finally:
        vec.close()
        again.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_gymnasium_vector_api(mode: str) -> None:
    vec = make_gym_vec_env(2, vectorization_mode=mode, **SMALL)
    try:
        obs, _info = vec.reset(seed=3)
        assert obs.shape == (2, *vec.single_observation_space.shape)
        obs, reward, *_ = vec.step(vec.action_space.sample())
        assert reward.shape == (2,) and np.isfinite(reward).all()
        again = make_gym_vec_env(2, vectorization_mode="sync", **SMALL)
        o2, _ = again.reset(seed=3)
        again.close()
        assert np.array_equal(vec.reset(seed=3)[0], o2)  # same seeds in either mode
    finally:
        vec.close()


def test_bad_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match="n_envs"):
        make_sb3_vec_env(0)
    with pytest.raises(ValueError, match="vectorization_mode"):
        make_gym_vec_env(2, vectorization_mode="threads")


def test_env_creator_builds_from_one_config_mapping() -> None:
    env = env_creator({"episode_steps": 3, "max_groups": 5})
    try:
        assert env.unwrapped.episode_steps == 3 and env.unwrapped.encoder.max_groups == 5
        obs, _ = env.reset(seed=0)
        assert obs in env.observation_space
    finally:
        env.close()
    with pytest.raises(TypeError):
        env_creator({"no_such_option": 1})


def test_per_env_infos_follows_the_masks_of_nested_dicts() -> None:
    """A nested dict's own ``_key`` masks say which envs have each key (before, every env
    got every key), and an empty nested dict (a node without MBA: ``mb``) gives each env
    an empty dict (before, a ValueError)."""
    infos = {
        "mb": {},
        "_mb": np.array([True, True]),
        "terms": {
            "a": np.array([1.0, 2.0]),
            "_a": np.array([True, False]),
            "b": np.array([3, 4]),
            "_b": np.array([True, True]),
        },
        "_terms": np.array([True, True]),
    }
    assert per_env_infos(infos, 2) == [
        {"mb": {}, "terms": {"a": 1.0, "b": 3}},
        {"mb": {}, "terms": {"b": 4}},
    ]


@pytest.mark.parametrize(
    "refused",
    [
        [{"baseline": "full"}, {}],  # its envs reset together, with one set
        [{"baseline": "full"}],  # one set for two envs
    ],
)
def test_set_options_of_the_batched_vec_env_refuses_what_its_envs_cannot_share(refused) -> None:
    """Refused where they are given, the options set before kept: before, they were refused
    at the next reset and left set, so every reset after refused them too."""
    first = []
    for refuse in (False, True):
        venv = make_batched_vec_env(2, seed=3, **SMALL)
        venv.set_options({"baseline": "equal"})
        if refuse:
            with pytest.raises(ValueError, match="option"):
                venv.set_options(refused)
        first.append(venv.reset())
        venv.set_options({"baseline": "full"})
        first.append(venv.reset())
        venv.close()
    np.testing.assert_array_equal(first[0], first[2])
    np.testing.assert_array_equal(first[1], first[3])

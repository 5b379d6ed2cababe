"""Rollout workers on Ray: the training environments spread over Ray actors, one SB3 VecEnv.

:class:`RayVecEnv` splits ``n_envs`` Partition-v0 environments into ``workers`` shards;
each shard is a Ray actor holding one :class:`envs.vector_env.PartitionVectorEnv` (the
batched simulator), so a step sends each actor its slice of the actions and gathers the
observations, rewards and action masks in one round trip per actor while the learner
(SB3's PPO in the driver) waits. Environment ``i`` (over all shards) is seeded
``seed + i``, so a run's environments are the same whatever the number of workers (one
worker or the in-process vector env give the same trajectories; tested).

Used by ``rdtune train --ray-address HOST:PORT`` (an existing cluster: ``ray start --head``
on one machine, ``ray start --address HOST:PORT`` on the others; docs/TRAINING.md) or
``--ray-address local``. What crosses to an actor is data only (env kwargs, seeds,
actions): each actor imports ``envs`` itself (the driver's gymnasium registry is not
visible there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from envs.vector import per_env_infos, sb3_step_infos, set_shared_options, shared_options


class RolloutError(RuntimeError):
    """Rollout workers that cannot run (e.g. more workers than the cluster has CPUs)."""


class _Shard:
    """A Ray actor's environments: ``n`` envs of ``env_id`` through its vector entry point
    (for Partition-v0, one PartitionVectorEnv over a batched simulator)."""

    def __init__(self, n: int, env_id: str, env_kwargs: Mapping[str, Any]) -> None:
        import gymnasium as gym

        import envs  # noqa: F401  (registers the ids in this worker)

        self.env = gym.make_vec(
            env_id, num_envs=n, vectorization_mode="vector_entry_point", **dict(env_kwargs)
        ).unwrapped

    def describe(self):
        """What the driver's VecEnv exposes: the single spaces, the encoder and decoder."""
        env = self.env
        return env.single_observation_space, env.single_action_space, env.encoder, env.decoder

    def reset(self, seeds: list[int] | None, options: dict | None):
        obs, infos = self.env.reset(seed=seeds, options=options)
        return obs, self.env.action_masks(), per_env_infos(infos, self.env.num_envs)

    def step(self, actions: np.ndarray):
        """The step as SB3 takes it (envs/vector.py ``sb3_step_infos``): observations,
        rewards, terminated, truncated, each env's info, the reset infos of the envs that
        started an episode, the action masks."""
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        out, started = sb3_step_infos(infos, terminated, truncated)
        return obs, rewards, terminated, truncated, out, started, self.env.action_masks()


def shard_sizes(n_envs: int, workers: int) -> list[int]:
    """Envs per worker: as even as possible, the first ones taking the remainder."""
    if workers < 1 or n_envs < workers:
        raise ValueError(f"need 1 <= workers <= n_envs, got {workers} workers for {n_envs}")
    base, extra = divmod(n_envs, workers)
    return [base + (1 if i < extra else 0) for i in range(workers)]


def ray_vec_env(
    n_envs: int,
    workers: int,
    *,
    env_id: str = "rdtune/Partition-v0",
    seed: int = 0,
    **env_kwargs: Any,
):
    """An SB3 VecEnv of ``n_envs`` envs of ``env_id`` on ``workers`` Ray actors (needs a
    running Ray: :func:`envs.cluster.start_ray`), with episode statistics
    (``VecMonitor``)."""
    from stable_baselines3.common.vec_env import VecMonitor

    venv = VecMonitor(_class()(n_envs, workers, env_id, env_kwargs))
    venv.seed(seed)
    return venv


_CLASS = None


def _class():
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import ray
    from stable_baselines3.common.vec_env import VecEnv

    class RayVecEnv(VecEnv):
        """SB3 VecEnv over Ray actors (module docstring)."""

        def __init__(
            self, n_envs: int, workers: int, env_id: str, env_kwargs: Mapping[str, Any]
        ) -> None:
            kw = dict(env_kwargs)
            self.render_mode = None  # no rendering (SB3 asks)
            sizes = shard_sizes(n_envs, workers)
            cpus = ray.cluster_resources().get("CPU", 0)
            if workers > cpus:
                # each actor takes a CPU: the ones beyond would wait for one forever
                raise RolloutError(
                    f"{workers} rollout workers need {workers} CPUs; the Ray cluster has {cpus:g}"
                )
            self._bounds = np.cumsum([0, *sizes])
            actor = ray.remote(num_cpus=1)(_Shard)
            self._shards = [actor.remote(k, env_id, kw) for k in sizes]
            obs_space, act_space, self.encoder, self.decoder = ray.get(
                self._shards[0].describe.remote()
            )
            super().__init__(n_envs, obs_space, act_space)
            self._masks = np.ones((n_envs, int(self.decoder.nvec.sum())), dtype=bool)
            self._pending = None

        def _slices(self):
            return [slice(a, b) for a, b in zip(self._bounds[:-1], self._bounds[1:], strict=True)]

        def _open(self) -> None:
            if not self._shards:
                raise RuntimeError("the RayVecEnv is closed (its Ray actors are gone)")

        def reset(self):
            self._open()
            seeds = self._seeds if any(s is not None for s in self._seeds) else None
            options = shared_options(self._options)  # as the in-process batched env
            futures = [
                s.reset.remote(None if seeds is None else list(seeds[sl]), options)
                for s, sl in zip(self._shards, self._slices(), strict=True)
            ]
            got = ray.get(futures)
            self._masks = np.concatenate([g[1] for g in got])
            self.reset_infos = [info for g in got for info in g[2]]
            self._reset_seeds()
            self._reset_options()
            return np.concatenate([g[0] for g in got])

        def set_options(self, options: list[dict] | dict | None = None) -> None:
            set_shared_options(self, options)  # as the in-process batched env

        def step_async(self, actions) -> None:
            self._open()
            actions = np.asarray(actions)
            self._pending = [
                s.step.remote(actions[sl])
                for s, sl in zip(self._shards, self._slices(), strict=True)
            ]

        def step_wait(self):
            got = ray.get(self._pending)
            self._pending = None
            obs = np.concatenate([g[0] for g in got])
            rewards = np.concatenate([g[1] for g in got]).astype(np.float32)
            terminated = np.concatenate([g[2] for g in got])
            truncated = np.concatenate([g[3] for g in got])
            self._masks = np.concatenate([g[6] for g in got])
            infos = [info for g in got for info in g[4]]
            for lo, g in zip(self._bounds[:-1], got, strict=True):
                for i, info in g[5].items():
                    self.reset_infos[int(lo) + i] = info
            return obs, rewards, terminated | truncated, infos

        def action_masks(self) -> np.ndarray:
            """MaskablePPO's masks of every env, as the last step (or reset) left them."""
            return self._masks

        def close(self) -> None:
            for s in self._shards:
                ray.kill(s)
            self._shards = []

        def get_attr(self, attr_name: str, indices=None) -> list:
            value = getattr(self, attr_name)
            return [value for _ in self._get_indices(indices)]

        def set_attr(self, attr_name: str, value, indices=None) -> None:
            raise AttributeError("the environments live in Ray actors")

        def env_method(self, method_name: str, *args, indices=None, **kwargs) -> list:
            if method_name != "action_masks":
                raise AttributeError(f"RayVecEnv answers action_masks only, not {method_name}")
            return [self._masks[i] for i in self._get_indices(indices)]

        def env_is_wrapped(self, wrapper_class, indices=None) -> list[bool]:
            return [False for _ in self._get_indices(indices)]

        def get_images(self):
            raise NotImplementedError("the environments do not render")

    _CLASS = RayVecEnv
    return _CLASS

"""Vectorised construction: SB3 VecEnvs (DummyVecEnv / SubprocVecEnv) and Gymnasium's vector API.

SB3 VecEnvs are not ``gymnasium.vector`` (docs/RL.md): the final observation is in
``info["terminal_observation"]`` and ``reset()`` returns only observations. MaskablePPO
reads masks through ``env_method("action_masks")``, which both SB3 VecEnvs forward to the
env itself (:meth:`envs.partition.PartitionEnv.action_masks`), so SubprocVecEnv works too.
Each copy ``i`` is seeded ``seed + i``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym

from envs import PARTITION_ID


def env_factory(env_id: str = PARTITION_ID, **kwargs: Any) -> Callable[[], gym.Env]:
    """A picklable zero-argument constructor (for SubprocVecEnv's worker processes)."""

    def make() -> gym.Env:
        import envs  # noqa: F401  (registers the ids inside a fresh worker process)

        return gym.make(env_id, **kwargs)

    return make


def make_sb3_vec_env(
    n_envs: int = 2,
    *,
    env_id: str = PARTITION_ID,
    seed: int = 0,
    subproc: bool = False,
    start_method: str | None = None,
    **env_kwargs: Any,
):
    """An SB3 VecEnv of ``n_envs`` Monitor-wrapped copies of ``env_id`` (``env_kwargs``).

    ``subproc=True`` runs each copy in its own process (``start_method``: fork, spawn or
    forkserver; SB3's default when None).
    """
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    if not isinstance(n_envs, int) or n_envs < 1:
        raise ValueError(f"n_envs must be a positive integer, got {n_envs!r}")
    return make_vec_env(
        env_factory(env_id, **env_kwargs),
        n_envs=n_envs,
        seed=seed,
        vec_env_cls=SubprocVecEnv if subproc else DummyVecEnv,
        vec_env_kwargs={"start_method": start_method} if subproc and start_method else None,
    )


def make_gym_vec_env(
    n_envs: int = 2,
    *,
    env_id: str = PARTITION_ID,
    vectorization_mode: str = "sync",
    **env_kwargs: Any,
) -> gym.vector.VectorEnv:
    """Gymnasium's vector API (``gymnasium.make_vec``): ``sync`` or ``async`` copies.
    Seed with ``reset(seed=...)`` (copy ``i`` gets ``seed + i``)."""
    if vectorization_mode not in ("sync", "async"):
        raise ValueError(
            f"vectorization_mode must be 'sync' or 'async', got {vectorization_mode!r}"
        )
    return gym.make_vec(
        env_id, num_envs=n_envs, vectorization_mode=vectorization_mode, **env_kwargs
    )


def env_creator(config: Mapping[str, Any] | None = None) -> gym.Env:
    """An env from one config mapping, the form Ray RLlib hands to an env creator
    (``tune.register_env("rdtune/Partition-v0", env_creator)``; the gymnasium registry is
    not visible in Ray workers, docs/RL.md). ``config["env_id"]`` picks the env (default
    Partition-v0); every other key is a keyword of the env."""
    import envs  # noqa: F401  (registers the ids in a fresh worker)

    kwargs = dict(config or {})
    env_id = kwargs.pop("env_id", PARTITION_ID)
    return gym.make(env_id, **kwargs)

"""Vectorised construction: SB3 VecEnvs and Gymnasium's vector API.

The batched path (the default for training): ``gymnasium.make_vec(PARTITION_ID,
num_envs=N, vectorization_mode="vector_entry_point")`` is N environments over one batched
simulator (:class:`envs.vector_env.PartitionVectorEnv`), and :func:`sb3_vector_env` is its
SB3 ``VecEnv`` (:func:`make_batched_vec_env` builds both). The per-env paths remain: SB3's
DummyVecEnv / SubprocVecEnv of single envs, and gymnasium's sync/async vector envs.

SB3 VecEnvs are not ``gymnasium.vector`` (docs/RL.md): the final observation is in
``info["terminal_observation"]`` and ``reset()`` returns only observations. MaskablePPO
reads masks through ``env_method("action_masks")``, which both SB3 VecEnvs forward to the
env itself (:meth:`envs.partition.PartitionEnv.action_masks`), so SubprocVecEnv works too.
Each copy ``i`` is seeded ``seed + i``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import gymnasium as gym

from envs import PARTITION_ID


def make_batched_vec_env(
    n_envs: int = 2, *, env_id: str = PARTITION_ID, seed: int = 0, **env_kwargs: Any
):
    """SB3 ``VecEnv`` of ``n_envs`` copies of ``env_id`` (Partition-v0) stepped by its
    ``vector_entry_point`` (one batched simulator), with episode statistics
    (``VecMonitor``); env ``i`` is seeded ``seed + i``."""
    from stable_baselines3.common.vec_env import VecMonitor

    if not isinstance(n_envs, int) or n_envs < 1:
        raise ValueError(f"n_envs must be a positive integer, got {n_envs!r}")
    venv = gym.make_vec(
        env_id, num_envs=n_envs, vectorization_mode="vector_entry_point", **env_kwargs
    )
    out = VecMonitor(sb3_vector_env(venv))
    out.seed(seed)
    return out


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


def sb3_vector_env(venv: gym.vector.VectorEnv):
    """An SB3 ``VecEnv`` over the batched env (:class:`envs.vector_env.PartitionVectorEnv`,
    under any gymnasium vector wrappers) autoresetting in the same step (its default):
    SB3's conventions (``reset`` returns observations only, ``dones`` = terminated or
    truncated, the last observation of a finished episode in
    ``info["terminal_observation"]``, ``TimeLimit.truncated``, a wrapper's ``episode``
    statistics in the step's info), ``env_method("action_masks")`` answered from the
    vector env's masks (MaskablePPO), and attributes such as ``encoder`` read from the
    vector env as its ``get_attr`` gives them. SB3's ``seed()`` seeds the next reset (env
    ``i`` gets ``seed + i``). What the batched env's envs share (its other attributes and
    methods, reset options) is set for all of them or refused, never for some silently."""
    return _sb3_class()(venv)


_SB3_CLASS = None


def shared_options(options: list[dict]) -> dict | None:
    """The one set of reset options SB3's per-env ``set_options`` gave every env (None:
    none), or ValueError: a batched env's envs reset together, with the same options."""
    if any(o != options[0] for o in options):
        raise ValueError(
            "the batched env takes one set of reset options for all its envs; "
            f"set_options gave them {options}"
        )
    return options[0] or None


def set_shared_options(venv, options: list[dict] | dict | None) -> None:
    """SB3's ``VecEnv.set_options`` for a VecEnv of batched envs, which reset together with
    one set of options: options that differ between its envs (or a list of another length)
    are refused where they are given, and the ones set before are kept (left set, every
    reset after refused them)."""
    from stable_baselines3.common.vec_env import VecEnv

    if isinstance(options, list) and len(options) != venv.num_envs:
        raise ValueError(f"set_options gave {len(options)} option sets for {venv.num_envs} envs")
    previous = venv._options
    VecEnv.set_options(venv, options)
    try:
        shared_options(venv._options)
    except ValueError:
        venv._options = previous
        raise


def sb3_step_infos(
    infos: Mapping[str, Any], terminated, truncated, reset_keys: Collection[str] | None = None
) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
    """SB3's infos of one step of a vector env that autoresets in the same step, as
    DummyVecEnv gives them: each env's (:func:`per_env_infos`) and ``TimeLimit.truncated``
    (every env, every step); for an env whose episode ended, the ended episode's (its
    ``final_info``) and ``terminal_observation``. Also the reset info of each env that
    started a new episode (what the vector env gives such an env at the top of its infos),
    which SB3 keeps in ``reset_infos``.

    ``reset_keys``: the keys a reset's infos have (None: every key at the top of an ended
    env's infos is its reset's). A key at the top that a reset does not give was put there
    by a wrapper about the step, as gymnasium's ``RecordEpisodeStatistics`` puts the ended
    episode's ``episode``: it stays in the step's info, where SB3 looks for it."""
    import numpy as np

    n = len(terminated)
    out = per_env_infos(infos, n)
    started: dict[int, dict[str, Any]] = {}
    ended = np.flatnonzero(terminated | truncated).tolist()
    if ended:
        final, last = infos["final_obs"], per_env_infos(infos["final_info"], n)
        for i in ended:
            top = out[i]
            if reset_keys is None:
                started[i], out[i] = top, last[i]
            else:
                started[i] = {k: v for k, v in top.items() if k in reset_keys}
                out[i] = {**last[i], **{k: v for k, v in top.items() if k not in reset_keys}}
            out[i]["terminal_observation"] = final[i]
    for info, cut in zip(out, (truncated & ~terminated).tolist(), strict=True):
        info["TimeLimit.truncated"] = cut
    return out, started


def per_env_infos(infos: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    """A gymnasium vector env's infos (a dict of arrays over envs, with ``_key`` masks) as
    SB3 hands them on: one dict per env. A nested dict (``reward_terms``) becomes one dict
    per env too; numbers become Python's, as a single env gives them. The ``_key`` masks
    and the autoreset's ``final_obs`` and ``final_info`` are left out (the adapter puts
    a finished episode's in its own way), and so is a key from the dict of an env its
    ``_key`` mask marks as without it."""
    out: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, value in infos.items():
        if key[0] == "_" or key in ("final_obs", "final_info"):
            continue
        mask = infos.get("_" + key)
        if isinstance(value, Mapping):
            rows: Any = _nested_rows(value, n)
        else:
            rows = _values(value)
        for i, (d, v) in enumerate(zip(out, rows, strict=True)):
            if mask is None or mask[i]:
                d[key] = v
    return out


def _nested_rows(value: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    """One dict per env of a nested info dict, each with the keys its ``_key`` masks give
    that env (every key where a key has no mask or marks every env)."""
    names = [k for k in value if k[0] != "_"]
    everywhere = [k for k in names if _marks_all(value.get("_" + k))]
    if everywhere:
        columns = zip(*(_values(value[k]) for k in everywhere), strict=True)
        rows = [dict(zip(everywhere, r, strict=True)) for r in columns]
    else:
        rows = [{} for _ in range(n)]
    for key in names:
        if key not in everywhere:
            for d, v, has in zip(rows, _values(value[key]), value["_" + key], strict=True):
                if has:
                    d[key] = v
    return rows


def _marks_all(mask) -> bool:
    return mask is None or bool(mask.all())


def _values(array) -> Any:
    """The per-env values of one info array: Python numbers for a flat array (tolist, in
    C), each env's row for a deeper one."""
    return array.tolist() if getattr(array, "ndim", 2) == 1 else array


def _sb3_class():
    global _SB3_CLASS
    if _SB3_CLASS is not None:
        return _SB3_CLASS
    import numpy as np
    from gymnasium.vector import AutoresetMode
    from stable_baselines3.common.vec_env import VecEnv

    class _SB3VectorEnv(VecEnv):
        def __init__(self, venv: gym.vector.VectorEnv) -> None:
            mode = venv.metadata.get("autoreset_mode")
            if mode is not AutoresetMode.SAME_STEP:
                raise ValueError(
                    f"SB3 needs a vector env that autoresets in the same step, got {mode}"
                )
            from envs.vector_env import PartitionVectorEnv

            if not isinstance(venv.unwrapped, PartitionVectorEnv):
                raise TypeError(
                    "sb3_vector_env adapts the batched env (PartitionVectorEnv, under any "
                    f"gymnasium vector wrappers), not {type(venv.unwrapped).__name__}; for "
                    "copies of a single env use make_sb3_vec_env (SB3's DummyVecEnv or "
                    "SubprocVecEnv)"
                )
            self.venv = venv
            # attributes and methods are the env's own, under any gymnasium vector wrapper
            # (which passes none of them on): steps and resets go through the wrappers
            self._env = venv.unwrapped
            self.render_mode = None  # no rendering (SB3 asks)
            super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
            self._actions = None
            self._reset_keys: set[str] | None = None

        def reset(self):
            seeds = self._seeds if any(s is not None for s in self._seeds) else None
            obs, infos = self.venv.reset(seed=seeds, options=shared_options(self._options))
            self.reset_infos = per_env_infos(infos, self.num_envs)
            self._reset_keys = {k for k in infos if k[0] != "_"}
            self._reset_seeds()
            self._reset_options()
            return obs

        def set_options(self, options: list[dict] | dict | None = None) -> None:
            set_shared_options(self, options)

        def step_async(self, actions) -> None:
            self._actions = actions

        def step_wait(self):
            obs, rewards, terminated, truncated, infos = self.venv.step(self._actions)
            out, started = sb3_step_infos(infos, terminated, truncated, self._reset_keys)
            for i, info in started.items():
                self.reset_infos[i] = info
            return obs, rewards.astype(np.float32), terminated | truncated, out

        def close(self) -> None:
            self.venv.close()

        def _count(self, indices) -> list[int]:
            return list(self._get_indices(indices))

        def _all(self, indices, what: str) -> list[int]:
            """``indices`` when they are every env: the batched env's attributes and
            methods are its N envs' at once, so some of them alone cannot be changed."""
            idx = self._count(indices)
            if sorted(idx) != list(range(self.num_envs)):
                raise ValueError(
                    f"{what}: the batched env's {self.num_envs} envs share it; it applies to "
                    f"all of them (indices=None), not to {idx}"
                )
            return idx

        def get_attr(self, attr_name: str, indices=None) -> list:
            # each env's, as the vector env answers (one env's spaces, not the batch's)
            values = self._env.get_attr(attr_name)
            return [values[i] for i in self._count(indices)]

        def set_attr(self, attr_name: str, value, indices=None) -> None:
            idx = self._all(indices, f"set_attr({attr_name!r})")
            # through the env's own set_attr (what it refuses), one value for all its envs
            self._env.set_attr(attr_name, [value] * len(idx))

        def env_method(self, method_name: str, *args, indices=None, **kwargs) -> list:
            if method_name == "action_masks":  # each env's own rows: any of them alone
                masks = self._env.action_masks()
                return [masks[i] for i in self._count(indices)]
            self._all(indices, f"env_method({method_name!r})")
            return list(self._env.call(method_name, *args, **kwargs))

        def env_is_wrapped(self, wrapper_class, indices=None) -> list[bool]:
            return [False for _ in self._count(indices)]

        def get_images(self):
            raise NotImplementedError("the vector env does not render")

    _SB3_CLASS = _SB3VectorEnv
    return _SB3_CLASS

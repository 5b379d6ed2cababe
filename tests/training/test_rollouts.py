"""Rollout workers on Ray: the training envs split over Ray actors behave as the in-process
batched vector env (same seeds, same actions: same observations, rewards, resets and
masks, split over two workers), and ``rdtune train --rollout-workers`` trains on them (a
real local Ray instance)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from envs.vector import make_batched_vec_env
from training.rollouts import RolloutError, ray_vec_env, shard_sizes

FAST = {"episode_steps": 3, "interval_s": 0.5, "share_levels": 4, "mba_levels": 3}


@pytest.mark.parametrize(
    ("n", "workers", "sizes"),
    [(5, 1, [5]), (5, 2, [3, 2]), (6, 3, [2, 2, 2]), (7, 4, [2, 2, 2, 1])],
)
def test_shard_sizes(n, workers, sizes):
    assert shard_sizes(n, workers) == sizes


@pytest.mark.parametrize(("n", "workers"), [(2, 3), (2, 0)])
def test_shard_sizes_refuse_more_workers_than_envs(n, workers):
    with pytest.raises(ValueError, match="workers"):
        shard_sizes(n, workers)


def _masked(masks: np.ndarray, nvec: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
    out = np.zeros((len(masks), len(nvec)), dtype=np.int64)
    for i, m in enumerate(masks):
        for d, (o, k) in enumerate(zip(offsets, nvec, strict=True)):
            out[i, d] = rng.choice(np.flatnonzero(m[o : o + k]))
    return out


def _trajectory(venv, steps: int = 7) -> list:
    venv.seed(13)
    out = [venv.reset()]
    nvec = venv.get_attr("decoder")[0].nvec
    rng = np.random.default_rng(2)
    for _ in range(steps):
        masks = np.stack(venv.env_method("action_masks"))
        out.append(masks)
        obs, rewards, dones, infos = venv.step(_masked(masks, nvec, rng))
        finals = [i.get("terminal_observation") for i in infos]
        out += [obs, rewards, dones, finals, [i.get("TimeLimit.truncated") for i in infos]]
        # SB3's infos (the ended episode's on a done step) and the new episodes' reset infos
        out += [[i["scenario"] for i in infos], [i["reward_terms"]["total"] for i in infos]]
        out.append([i["scenario"] for i in venv.unwrapped.reset_infos])
    venv.close()
    return out


def _same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, list):
            assert len(x) == len(y)
            for u, v in zip(x, y, strict=True):
                assert (u is None) == (v is None)
                if u is not None:
                    np.testing.assert_array_equal(u, v)
        else:
            np.testing.assert_array_equal(x, y)


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_ray_workers_match_the_in_process_vector_env_and_train(tmp_path, ray_local):
    import ray

    from tests.training.tiny_runs import TINY
    from tuner.cli import main

    n = 3
    reference = _trajectory(make_batched_vec_env(n, **FAST))
    assert any(d.any() for d in reference[4::9])  # episodes ended and were reset
    # the shared local Ray (conftest: 2 CPUs)
    _same(_trajectory(ray_vec_env(n, 2, **FAST)), reference)
    equal = make_batched_vec_env(n, **FAST)
    equal.set_options({"baseline": "equal"})
    expected = equal.reset()
    equal.close()
    venv = ray_vec_env(n, 2, **FAST)
    venv.set_options({"baseline": "equal"})
    with pytest.raises(ValueError, match="one set of reset options for all its envs"):
        venv.set_options([{"baseline": "full"}, {}, {}])  # its envs reset together
    np.testing.assert_array_equal(venv.reset(), expected)  # the options set before
    venv.close()
    with pytest.raises(RuntimeError, match="the RayVecEnv is closed"):
        venv.reset()
    # rdtune train on Ray rollout workers (the Ray running here is used and left up)
    config = dict(TINY, total_timesteps=64)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "run"
    argv = ["train", "--config", str(path), "--out", str(out), "--no-progress"]
    assert main([*argv, "--rollout-workers", "1"]) == 0
    assert ray.is_initialized()
    # more workers than the cluster has CPUs: a clear error, not actors waiting forever
    with pytest.raises(RolloutError, match="3 rollout workers need 3 CPUs"):
        ray_vec_env(n, 3, **FAST)
    assert yaml.safe_load((out / "config.yaml").read_text())["rollout_workers"] == 1
    cycles = [json.loads(line) for line in (out / "throughput.jsonl").read_text().splitlines()]
    assert sum(c["env_steps"] for c in cycles) == 64
    assert (out / "model.zip").is_file()

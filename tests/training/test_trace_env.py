"""TracePartition-v0 (training against a trace-driven node) and env recording to Parquet."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from envs.recording import RecordTrace
from tests.training.trace_edits import meta_value, rewrite_meta
from training.trace_env import episode_writers
from training.traces import TraceError, load_trace

ENV_ID = "training.trace_env:rdtune/TracePartition-v0"


@pytest.fixture(scope="module")
def trace_path(explore_trace) -> str:
    return explore_trace.path


def test_env_passes_the_checkers_and_steps(trace_path) -> None:
    from gymnasium.utils.env_checker import check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    env = gym.make(ENV_ID, traces=[trace_path], episode_steps=4, interval_s=0.5)
    check_env(env.unwrapped, skip_render_check=True)
    sb3_check_env(env.unwrapped)
    obs, info = env.reset(seed=3)
    assert set(info["slots"]) == set(load_trace(trace_path).groups)
    total = 0.0
    for _ in range(4):
        obs, reward, _term, trunc, info = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs) and np.isfinite(reward)
        total += reward
    assert trunc
    env.close()


def test_same_seed_same_episode(trace_path) -> None:
    def run(seed):
        env = gym.make(ENV_ID, traces=[trace_path], episode_steps=3, interval_s=0.5)
        env.reset(seed=seed)
        env.action_space.seed(0)
        out = [env.step(env.action_space.sample())[1] for _ in range(3)]
        env.close()
        return out

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_record_trace_wrapper_writes_one_parquet_trace_per_episode(trace_path, tmp_path) -> None:
    """envs' RecordTrace with this package's Parquet writer."""
    import json

    base = gym.make(ENV_ID, traces=[trace_path], episode_steps=3, interval_s=0.5)
    env = RecordTrace(base, episode_writers(tmp_path / "eps"))
    rewards = []
    for ep in range(2):
        env.reset(seed=ep)
        env.action_space.seed(ep)
        for _ in range(3):
            rewards.append(env.step(env.action_space.sample())[1])
        # a simulated episode runs again from its seed: no journal is kept while it records
        assert not list((tmp_path / "eps").glob("*.journal"))
    env.close()
    files = sorted((tmp_path / "eps").glob("*.parquet"))
    assert [f.name for f in files] == ["episode-00000.parquet", "episode-00001.parquet"]
    got = []
    for f in files:
        trace = load_trace(f)
        assert len(trace) == 4  # the reset interval and three steps
        notes = [json.loads(s.note) for s in trace.steps]
        got += [n["reward"] for n in notes[1:]]
        for prev, cur in zip(trace.steps, trace.steps[1:], strict=False):
            if prev.applied is not None:
                assert cur.allocation == prev.applied
    assert got == pytest.approx(rewards)


@pytest.mark.parametrize(
    ("sign", "problem"),
    [
        (True, "metadata 'capabilities.memory_bandwidth_bps' is not a finite number"),
        (False, "metadata checksum mismatch: the footer is corrupt"),
    ],
    ids=["malformed", "corrupt"],
)
def test_a_bad_trace_is_refused_naming_the_file(trace_path, tmp_path, sign, problem) -> None:
    """Refused as the env is made, rather than failing inside the fit of its dynamics: a
    malformed value (the checksum recomputed, as a deliberate edit would) or the same edit
    without it (a corrupt footer)."""
    caps = {**meta_value(trace_path, "capabilities"), "memory_bandwidth_bps": "lots"}
    bad = tmp_path / "bad.parquet"
    rewrite_meta(trace_path, bad, sign=sign, capabilities=caps)
    with pytest.raises(TraceError) as err:
        gym.make(ENV_ID, traces=[str(bad)], episode_steps=4)
    assert str(err.value).startswith(f"trace {bad}: {problem}")


def test_a_missing_trace_is_a_trace_error_naming_it(tmp_path) -> None:
    """It was a bare FileNotFoundError: the fit cache looked at the file's time before the
    reader looked at the file."""
    missing = tmp_path / "gone.parquet"
    with pytest.raises(TraceError) as err:
        gym.make(ENV_ID, traces=[str(missing)], episode_steps=4)
    assert str(err.value) == f"trace {missing}: no such file"


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"noise": "false"}, "noise must be true or false"),
        ({"noise": 0}, "noise must be true or false"),
        ({"trace_step_s": 0}, "trace_step_s must be a positive number"),
        ({"trace_step_s": -0.0}, "trace_step_s must be a positive number"),
        ({"trace_step_s": float("nan")}, "trace_step_s must be a positive number"),
        ({"trace_step_s": True}, "trace_step_s must be a positive number"),
        ({"trace_step_s": 1e-4}, "trace_step_s must be at least 0.001 s"),
        ({"scenario": "copart_h_llc"}, "takes no scenario"),
    ],
)
def test_settings_partition_v0_refuses_are_refused(trace_path, kwargs, problem) -> None:
    """A string noise flag would be truthy, a zero step fell back to the trace's interval,
    a tiny one ran for minutes per reset, and a scenario was ignored but reported."""
    with pytest.raises(ValueError, match=problem):
        gym.make(ENV_ID, traces=[trace_path], episode_steps=2, **kwargs)


def test_resetting_the_trace_family_to_a_scenario_is_refused(trace_path) -> None:
    from training.trace_env import TraceNodes

    with pytest.raises(ValueError, match="cannot reset to scenario 'default'"):
        TraceNodes([trace_path]).reset("default", seed=0)


def test_info_and_recorded_episodes_name_the_trace_replayed(
    trace_path, heldout_trace, tmp_path
) -> None:
    """Each episode's info, and its recorded file, name the trace its reset picked (the
    file's stem): the two recordings here are of one scenario and last 90 s and 20 s."""
    import shutil

    short = tmp_path / "short.parquet"
    shutil.copy(heldout_trace, short)
    base = gym.make(ENV_ID, traces=[trace_path, str(short)], episode_steps=1)
    env = RecordTrace(base, episode_writers(tmp_path / "eps"))
    seen = {}
    for seed in range(8):
        _obs, info = env.reset(seed=seed)
        replayed = base.unwrapped.node._nodes.current.replay.duration_s
        seen[info["scenario"]] = round(replayed)
        assert env.step(env.action_space.sample())[4]["scenario"] == info["scenario"]
    env.close()
    stem = trace_path.rsplit("/", 1)[-1].removesuffix(".parquet")
    assert seen == {stem: 90, "short": 20}
    recorded = {load_trace(f).scenario["name"] for f in (tmp_path / "eps").glob("*.parquet")}
    assert recorded == {stem, "short"}

"""Recording wrappers: intervals into the Parquet trace format, transitions into JSON lines."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

import envs
from envs.recording import (
    JsonlTransitionWriter,
    RecordTrace,
    RecordTransitions,
    layout_header,
    read_jsonl,
)

traces = pytest.importorskip("training.traces", reason="the trace format (training) is absent")


def _parquet_writer(tmp_path):
    def open_writer(env, episode):
        return traces.TraceWriter(
            tmp_path / f"episode{episode}.parquet",
            env.capabilities,
            env.group_specs,
            "random-policy",
            scenario={"name": env.node.scenario.name},
            seed=env.node.seed,
            interval_s=env.interval_s,
        )

    return open_writer


def test_every_interval_goes_to_the_parquet_trace(tmp_path) -> None:
    env = RecordTrace(
        gym.make(envs.PARTITION_ID, episode_steps=3, interval_s=0.5), _parquet_writer(tmp_path)
    )
    actions, rewards = [], []
    for episode in range(2):
        env.reset(seed=episode)
        done = False
        while not done:
            a = env.action_space.sample()
            _, r, term, trunc, _ = env.step(a)
            actions.append(a.tolist())
            rewards.append(r)
            done = term or trunc
    env.close()
    steps = []
    for episode in range(2):
        trace = traces.load_trace(tmp_path / f"episode{episode}.parquet")
        assert len(trace.steps) == 4  # the reset interval and three steps
        assert [s.snapshot.timestamp for s in trace.steps] == pytest.approx([0.5, 1, 1.5, 2])
        steps += trace.steps
        # What was applied after an interval is what the next interval held.
        for prev, nxt in zip(trace.steps, trace.steps[1:], strict=False):
            assert (prev.applied or prev.allocation) == nxt.allocation
        assert trace.steps[-1].applied is None
    notes = [json.loads(s.note) for s in steps]
    assert notes[0] == {"episode": 0, "step": 0, "event": "reset"}
    acted = [n for n in notes if "action" in n]
    assert [n["action"] for n in acted] == actions
    assert [n["reward"] for n in acted] == pytest.approx(rewards)
    assert all(n["reward_terms"]["total"] == pytest.approx(n["reward"]) for n in acted)


def test_a_non_writer_is_rejected(tmp_path) -> None:
    env = RecordTrace(gym.make(envs.PARTITION_ID, episode_steps=2), lambda env, ep: object())
    with pytest.raises(TypeError, match="not a TraceWriter"):
        env.reset(seed=0)
    with pytest.raises(TypeError, match="callable"):
        RecordTrace(gym.make(envs.PARTITION_ID), "not callable")


def test_transitions_go_to_json_lines(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    inner = gym.make(envs.PARTITION_ID, episode_steps=2, interval_s=0.5)
    env = RecordTransitions(inner, JsonlTransitionWriter(path, layout_header(inner)))
    obs0, _ = env.reset(seed=4)
    a = env.action_space.sample()
    obs1, r1, *_ = env.step(a)
    obs2, r2, _, trunc, _ = env.step(env.action_space.sample())
    env.close()
    header, rows = read_jsonl(path)
    assert header["features"]["names"] == list(inner.unwrapped.encoder.names)
    assert header["actions"]["nvec"] == inner.action_space.nvec.tolist()
    assert [r["step"] for r in rows] == [0, 1] and rows[1]["truncated"] == trunc is True
    assert np.allclose(rows[0]["obs"], obs0) and np.allclose(rows[0]["next_obs"], obs1)
    assert np.allclose(rows[1]["obs"], obs1) and np.allclose(rows[1]["next_obs"], obs2)
    assert rows[0]["action"] == a.tolist() and rows[0]["reward"] == pytest.approx(r1)
    assert set(rows[0]["plan"]) == {"ways", "masks", "mb"} and rows[0]["plan"]["ways"]
    assert rows[1]["reward_terms"]["total"] == pytest.approx(r2)


def test_reading_a_foreign_file_fails_clearly(tmp_path) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"header": {"format": "other"}}\n')
    with pytest.raises(ValueError, match="not an rdtune transitions file"):
        read_jsonl(bad)
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"x.jsonl:1: not a JSON line"):
        read_jsonl(bad)

"""Whole Partition-v0 trajectories are unchanged by the env's fast paths.

Two checks, on several configurations (presets with and without MBA, AMD, truncated slots,
both references and baselines, 0.1 s and 1 s intervals, episodes ending and resetting,
actions held and changed, out-of-mask levels and list actions that need repairs or the
decoder's slow path):

- ``test_env_steps_as_the_plain_composition``: ``env.step`` gives exactly (bit for bit)
  what the plain composition of the parts gives — a fresh ActionDecoder, an ``apply`` on
  every step, :func:`envs.reward.compute_reward` and a fresh FeatureEncoder — so every
  per-step shortcut (caches, skipped applies, fused passes) is checked against the
  definition, whatever the simulator computes.
- ``test_trajectories_are_pinned``: whole trajectories (observations, rewards,
  terminated/truncated, info) recorded in ``data/trajectories.npz``, first before the
  env's step was optimised; they also pin the decoder, encoder and reward themselves.
  Structure is pinned exactly and floats at tests/golden.py's tolerance, so the test
  passes on any x86-64 CPU. They depend on the simulator's numbers too: if the
  simulator's output changes on purpose (and the composition test still passes),
  regenerate with ``.venv/bin/python -m tests.envs.test_trajectories --write``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from envs.partition import PartitionEnv
from envs.reward import compute_reward, observed_ips
from models.actions import ActionDecoder
from models.features import FeatureEncoder
from tests import golden

DATA = Path(__file__).parent / "data" / "trajectories.npz"
STEPS = 40

CONFIGS: dict[str, dict] = {
    # recorded when episodes started from the equal split by default: pinned with it
    "default-0.1s": {
        "scenarios": ["default"],
        "baseline": "equal",
        "encoder_version": 1,
        "interval_s": 0.1,
        "episode_steps": 12,
    },
    "copart-1s": {
        "scenarios": ["copart_h_both"],
        "baseline": "equal",
        "encoder_version": 1,
        "interval_s": 1.0,
        "episode_steps": 16,
    },
    "amd-running-max-full": {
        "scenarios": "named",
        "preset": "epyc7302p",
        "reference": "running_max",
        "baseline": "full",
        "encoder_version": 1,
        "interval_s": 0.2,
        "episode_steps": 10,
    },
    "4clos-3-slots": {
        "scenarios": "named",
        "preset": "e5v3_4clos",
        "max_groups": 3,
        "baseline": "equal",
        "encoder_version": 1,
        "interval_s": 0.2,
        "episode_steps": 10,
    },
    "no-mba-random": {
        "scenarios": "random",
        "split": "train",
        "preset": "e5_2683v4",
        "baseline": "equal",
        "encoder_version": 1,
        "interval_s": 0.3,
        "episode_steps": 9,
    },
}


class _Composition(PartitionEnv):
    """Partition-v0 whose step is the plain composition of its parts (the definition)."""

    def step(self, action):
        decoded = ActionDecoder(
            self.decoder.max_groups, self.decoder.share_levels, self.decoder.mba_levels
        ).decode(action, self._slots, self._caps)
        before = after = self._alloc
        if decoded.plan.groups:
            after = self.node.apply(decoded.plan)
        self._wait()
        snap = self._observe()
        ips = observed_ips(snap)
        terms = compute_reward(
            snap, self._groups, self._reference(ips), self._caps, before, after, self.weights, ips
        )
        self._alloc, self._snap, self._terms, self._decoded = after, snap, terms, decoded
        self._steps += 1
        obs = FeatureEncoder(self.encoder.max_groups, self.encoder.version).encode(
            snap, after, self._groups, self._caps, self._slots
        )
        info = {
            "reward_terms": terms.as_dict(),
            "repairs": decoded.repairs,
            "shared": decoded.shared,
            "ways": decoded.ways,
            "masks": decoded.masks,
            "mb": decoded.mb,
            "slots": self._slots,
            "scenario": self._scenario_name,
            "time_s": snap.timestamp,
        }
        return obs, float(terms.total), False, self._steps >= self.episode_steps, info


def _json(value) -> str:
    return json.dumps(value, sort_keys=True, default=lambda o: o.tolist())


def _trajectory(env: PartitionEnv, seed: int = 7, steps: int = STEPS) -> list:
    """Every value the env hands back over ``steps`` steps (resetting when truncated)."""
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    out: list = [("reset", obs.tobytes(), _json(info))]
    action = rng.integers(0, env.action_space.nvec)
    for t in range(steps):
        if rng.random() < 0.6:  # else hold the previous action (repeated plans)
            if rng.random() < 0.5:  # what a MaskablePPO policy sends
                mask = env.action_masks()
                offsets = np.concatenate([[0], np.cumsum(env.action_space.nvec)[:-1]])
                action = np.array(
                    [
                        rng.choice(np.flatnonzero(mask[o : o + n]))
                        for o, n in zip(offsets, env.action_space.nvec, strict=True)
                    ]
                )
            else:  # any level anywhere: repairs for empty slots and missing resources
                action = rng.integers(0, env.action_space.nvec)
        sent = action.tolist() if t % 7 == 3 else action  # a list takes the checked path
        obs, reward, terminated, truncated, info = env.step(sent)
        out.append(
            (t, obs.tobytes(), repr(reward), terminated, truncated, _json(info), obs.dtype.str)
        )
        if terminated or truncated:
            obs, info = env.reset()
            out.append(("reset", obs.tobytes(), _json(info)))
    return out


def _record(trajectory: list) -> golden.Recorder:
    """Observations as numbers (their bytes would pin float bits), the rest as text."""
    rec = golden.Recorder()
    for record in trajectory:
        if record[0] == "reset":
            _, obs, info = record
            rec.add("reset")
            rec.add_floats(np.frombuffer(obs, dtype=np.float32))
            rec.add(info)
        else:
            t, obs, reward, terminated, truncated, info, dtype = record
            rec.add((t, reward, terminated, truncated, dtype))
            rec.add_floats(np.frombuffer(obs, dtype=np.dtype(dtype)))
            rec.add(info)
    return rec


def _records(names=tuple(CONFIGS)) -> dict[str, golden.Recorder]:
    out = {}
    for name in names:
        env = PartitionEnv(**{"split": "all", **CONFIGS[name]})
        out[name] = _record(_trajectory(env))
        env.close()
    return out


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_env_steps_as_the_plain_composition(name: str) -> None:
    kwargs = {"split": "all", **CONFIGS[name]}
    env, plain = PartitionEnv(**kwargs), _Composition(**kwargs)
    got, want = _trajectory(env), _trajectory(plain)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g == w
    env.close()
    plain.close()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_trajectories_are_pinned(name: str) -> None:
    golden.assert_matches(_records([name])[name], golden.load(DATA)[name], name)


if __name__ == "__main__" and "--write" in sys.argv:
    golden.write(DATA, _records())
    print(f"wrote {DATA}")

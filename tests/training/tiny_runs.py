"""Tiny training runs shared by the trainer, export, sweep and policy-runtime tests.

The fixtures are registered once for the whole suite (``pytest_plugins`` in
tests/conftest.py), so any test can ask for them and each tiny run trains once per test
process. (Imported into test modules instead, a session fixture gets one cache per module:
the same run trained again for each.)
"""

from __future__ import annotations

import copy

import pytest

# A run of a few seconds: 8-step episodes at a coarse simulator step, a small network.
TINY: dict = {
    "name": "tiny",
    "algorithm": "MaskablePPO",
    "seed": 3,
    "total_timesteps": 128,
    "n_envs": 2,
    "progress_bar": False,
    "env": {
        "kwargs": {
            "episode_steps": 8,
            "sim_step_s": 0.5,
            "share_levels": 4,
            "mba_levels": 3,
        }
    },
    "eval": {
        "freq": 64,
        "episodes": 1,
        "final_episodes": 2,
        "controllers": ["eq"],
        "kwargs": {"split": "validation"},
    },
    "policy": {"extractor": {"hidden": 16, "slot_hidden": 8}, "net_arch": {"pi": [16], "vf": [16]}},
    "ppo": {"n_steps": 32, "batch_size": 32, "n_epochs": 2},
}


def tiny_config(out_dir, **overrides):
    """The tiny config writing to ``out_dir``, with top-level ``overrides``."""
    from training.config import TrainConfig

    data = copy.deepcopy(TINY)
    data.update(overrides)
    data["output_dir"] = str(out_dir)
    return TrainConfig.parse(data)


def _train(tmp_path_factory, name: str, **overrides):
    from training.train import train

    out = tmp_path_factory.mktemp(name) / "run"
    return train(tiny_config(out, **overrides))


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A tiny MaskablePPO run (TrainResult)."""
    return _train(tmp_path_factory, "maskable")


SLOT_POLICY = {
    "extractor": {"hidden": 16, "slot_hidden": 8},
    "net_arch": {"pi": [], "vf": [16]},
    "head": "slots",
    "head_hidden": 16,
}


@pytest.fixture(scope="session")
def tiny_ppo_run(tmp_path_factory):
    """A tiny plain-PPO run with the shared per-slot head (TrainResult)."""
    return _train(tmp_path_factory, "ppo", algorithm="PPO", policy=SLOT_POLICY)


@pytest.fixture(scope="session")
def tiny_export(tiny_run, tmp_path_factory):
    """The tiny MaskablePPO run exported (directory with policy.onnx + model_card.json)."""
    from training.export import export_run

    out = tmp_path_factory.mktemp("export")
    export_run(tiny_run.run_dir, out, parity_observations=64)
    return out

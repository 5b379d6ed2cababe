"""The training benchmark's cycles: the default config's PPO, shrunk, timed per cycle."""

from __future__ import annotations

import pytest

from eval.bench.cli import UsageError, main, parse_overrides
from eval.bench.training import cycles, run


def test_cycles_time_rollouts_and_updates_of_the_default_config() -> None:
    small = {"n_envs": 3, "ppo.n_steps": 4, "ppo.batch_size": 12, "ppo.n_epochs": 1}
    rows = cycles(small, 2)
    assert len(rows) == 2  # the warm-up cycle left out
    assert [r["timesteps"] for r in rows] == [24, 36]
    for r in rows:
        assert r["env_steps"] == 12
        assert r["rollout_s"] > 0 and r["update_s"] > 0
        assert r["env_steps_per_s"] > 0


def test_overrides_reach_the_benchmarked_config() -> None:
    small = {"n_envs": 3, "ppo.n_steps": 4, "ppo.batch_size": 12, "ppo.n_epochs": 1}
    results = run(True, overrides=small)
    assert len(results) == 4  # the batched env only: whole cycle, rollout, update, CPU
    assert all("n_envs=3" in r.name and "ppo.n_epochs=1" in r.name for r in results)
    assert all(r.value > 0 for r in results)


def test_set_parses_yaml_values_and_needs_the_training_benchmark() -> None:
    assert parse_overrides(["ppo.n_epochs=4", "policy.net_arch={pi: [], vf: [32]}"]) == {
        "ppo.n_epochs": 4,
        "policy.net_arch": {"pi": [], "vf": [32]},
    }
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_overrides(["n_envs"])
    assert main(["policy", "--set", "n_envs=8"]) == 2

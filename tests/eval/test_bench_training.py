"""The training benchmark's cycles: the default config's PPO, shrunk, timed per cycle."""

from __future__ import annotations

from eval.bench.training import cycles


def test_cycles_time_rollouts_and_updates_of_the_default_config() -> None:
    small = {"n_envs": 3, "ppo.n_steps": 4, "ppo.batch_size": 12, "ppo.n_epochs": 1}
    rows = cycles(small, 2)
    assert len(rows) == 2  # the warm-up cycle left out
    assert [r["timesteps"] for r in rows] == [24, 36]
    for r in rows:
        assert r["env_steps"] == 12
        assert r["rollout_s"] > 0 and r["update_s"] > 0
        assert r["env_steps_per_s"] > 0

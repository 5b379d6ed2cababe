"""DAgger from the safe oracle: labels that mean the oracle's allocation, rounds that bring
the policy closer to it on its own states, and the trainer's warm start."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

import envs  # noqa: F401  (registers the ids)
from tests.training.tiny_runs import SLOT_POLICY, tiny_config
from training import bc
from training.config import ConfigError, DaggerConfig
from training.dagger import OracleTeacher, dagger, decoded_same
from training.train import train

# The demo's node (memcached beside three batch jobs on the Gold 6130): the oracle
# partitions it (docs/RESULTS.md, suite demo), so its labels are not the equal split.
ENV = dict(scenarios=["default"], episode_steps=8, interval_s=1.0, sim_step_s=0.5,
           share_levels=5, mba_levels=4)  # fmt: skip


def _make(**kw):
    return lambda: gym.make("rdtune/Partition-v0", **{**ENV, **kw})


@pytest.mark.parametrize("shield", [False, True])
def test_teacher_labels_put_the_oracles_allocation_on_the_node(shield) -> None:
    env = _make(shield=shield)()
    u = env.unwrapped
    teacher = OracleTeacher()
    env.reset(seed=0)
    teacher.start(env)
    partitioned = False
    for _ in range(ENV["episode_steps"]):
        label = teacher.label(env)
        ways, mb = teacher.target(env)
        floors = env.unwrapped.shield_floors()
        env.step(label)
        dom = u.capabilities.domains[0]
        held = [u.held_allocation.get(g, dom) for g in u.slots]
        want = ways if floors is None else np.maximum(ways, floors[0][0, : len(ways)]).tolist()
        if floors is None or sum(want) <= u.capabilities.l3.num_ways:
            assert [a.ways for a in held] == want
        assert [a.mb for a in held] == [int(m) for m in mb]
        partitioned |= len(set(ways)) > 1
    assert partitioned  # the oracle did not just hold the equal split
    env.close()


@pytest.mark.parametrize("share_all", [False, True])
def test_teacher_labels_the_unpartitioned_cache_when_the_decoder_can_say_it(share_all) -> None:
    # CoPart's H-LLC mix: the oracle keeps the cache unpartitioned (every group on every
    # way). With share_all the label says so; without, it is the nearest disjoint split.
    env = _make(scenarios=["copart_h_llc"], split="all", shield=True, share_all=share_all)()
    u = env.unwrapped
    teacher = OracleTeacher()
    env.reset(seed=0)
    teacher.start(env)
    for _ in range(3):
        label = teacher.label(env)
        env.step(label)
    full = u.capabilities.l3.cbm_mask
    assert teacher.target(env)[0] == [full.bit_count()] * len(u.slots)
    masks = [u.held_allocation.get(g, 0).l3_mask for g in u.slots]
    assert (masks == [full] * len(masks)) is share_all
    assert (label[: len(u.slots)] == 0).all() or not share_all
    env.close()


def test_decoded_same_compares_meanings_not_levels() -> None:
    env = _make()()
    env.reset(seed=0)
    n = len(env.unwrapped.slots)
    a = np.zeros(16, dtype=np.int64)
    b = a.copy()
    b[:n] = 2  # every share level equal: the same equal split as all zeros
    c = a.copy()
    c[0] = 4
    assert decoded_same(env, a, b) and not decoded_same(env, a, c)
    env.close()


def test_dagger_rounds_bring_the_policy_to_the_oracle_on_its_own_states() -> None:
    make = _make(shield=True)
    env = make()
    policy = bc.make_policy(env.unwrapped.encoder, env.unwrapped.decoder, (32,), seed=0)
    env.close()
    settings = DaggerConfig(iterations=3, episodes=2, epochs=40, batch_size=16, seed=5)
    result = dagger(policy, make, settings)
    rounds = result.rounds
    assert [r.states for r in rounds] == [16, 32, 48]  # aggregated, every state labelled
    assert [r.beta for r in rounds] == [1.0, 0.5, 0.25]
    assert len(result.demos) == 48
    # agreement before each refit, on the states that round visited: the untrained policy
    # almost never says what the oracle does; after two refits it mostly does
    assert rounds[0].agreement < 0.3
    assert rounds[-1].agreement > max(0.6, rounds[0].agreement + 0.3)


@pytest.mark.xdist_group("tiny_runs")
def test_train_with_a_dagger_warm_start_alone(tmp_path) -> None:
    cfg = tiny_config(
        tmp_path / "run",
        total_timesteps=0,
        policy=SLOT_POLICY,
        dagger={"iterations": 2, "episodes": 1, "epochs": 5},
    )
    result = train(cfg, final_eval=False)
    d = result.run_dir
    rounds = [json.loads(x) for x in (d / "dagger.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rounds] == [0, 1] and rounds[-1]["states"] == 16
    evals = [json.loads(x) for x in (d / "evaluations.jsonl").read_text().splitlines()]
    assert [e["timesteps"] for e in evals] == [0]  # the warm start is the checkpoint
    assert (d / "best_model.zip").is_file() and result.best_step == 0
    assert (d / "learning_curves.png").stat().st_size > 0  # training/curves.py


class _Seeded(Exception):
    """Raised by the stand-in for dagger() once it was given its settings."""


@pytest.mark.parametrize(
    ("seed", "dagger_seed", "used"),
    [(0, 0, 0), (7, 0, 7), (7, 5, 12)],  # seed 0, dagger.seed 0: as before (the shipped run)
)
def test_the_warm_start_is_seeded_from_the_runs_seed(
    tmp_path, monkeypatch, seed, dagger_seed, used
) -> None:
    """Before, every seed of a seed study warm-started from dagger.seed alone: the same
    oracle episodes and refit shuffles, so the spread between seeds was understated."""
    import training.dagger
    from training.train import warm_start

    def seeded(policy, make_env, settings, **kwargs):
        raise _Seeded(settings.seed)

    monkeypatch.setattr(training.dagger, "dagger", seeded)
    cfg = tiny_config(tmp_path, seed=seed, dagger={"iterations": 1, "seed": dagger_seed})
    with pytest.raises(_Seeded) as given:
        warm_start(cfg, type("Model", (), {"policy": None}), tmp_path, callback=None)
    assert given.value.args == (used,)
    assert cfg.dagger.seed == dagger_seed  # the config as written is what the run records


def test_the_curves_command_plots_runs_and_refuses_nothing_to_plot(tmp_path, capsys) -> None:
    from training.curves import main

    run = tmp_path / "run"
    run.mkdir()
    assert main([str(run), "--out", str(tmp_path / "none.png")]) == 1
    (run / "dagger.jsonl").write_text(
        json.dumps({"iteration": 0, "beta": 1.0, "states": 8, "agreement": 0.0, "loss": 3.0}) + "\n"
    )
    (run / "evaluations.jsonl").write_text(json.dumps({"timesteps": 0, "mean_return": -1.0}))
    assert main([str(run), "--out", str(tmp_path / "c.png"), "--labels", "a"]) == 0
    assert (tmp_path / "c.png").stat().st_size > 0 and "wrote" in capsys.readouterr().out


def test_nothing_to_train_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="total_timesteps: 0"):
        tiny_config(tmp_path, total_timesteps=0)

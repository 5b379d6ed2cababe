"""Training config parsing: the shipped configs load, bad ones fail naming the key."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.training.tiny_runs import SLOT_POLICY
from training.config import ConfigError, TrainConfig, load_config

CONFIGS = sorted((Path(__file__).parents[2] / "training" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_parse(path):
    cfg = load_config(path)
    assert cfg.algorithm in ("PPO", "MaskablePPO")
    # train on train, select checkpoints on validation, the final table on test
    assert cfg.env_kwargs().get("split", "train") == "train"
    assert cfg.eval_kwargs()["split"] == "validation"
    assert cfg.final_kwargs()["split"] == "test"
    assert cfg.eval.episodes >= 64


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"eval": {"kwargs": {"split": "test"}}}, "eval.kwargs: split 'test': checkpoint sel"),
        # selection inherits env.kwargs: an override there must not reach the test split
        (
            {"env": {"kwargs": {"split": "test"}}, "eval": {"kwargs": {}}},
            "env.kwargs: split 'test': training must not see the test split",
        ),
        ({"env": {"kwargs": {"split": "all"}}}, "env.kwargs: split 'all': training must not"),
        ({"eval": {"kwargs": {"split": "all"}}}, "eval.kwargs: split 'all'"),
        # the final table inherits eval.kwargs: it must still be played on test
        ({"eval": {"final_kwargs": {}}}, "eval.final_kwargs: split 'validation': the final"),
        ({"eval": {"final_kwargs": {"split": "train"}}}, "eval.final_kwargs: split 'train'"),
    ],
)
def test_no_override_lets_training_or_selection_see_the_test_split(data, message):
    """Checked on the kwargs each env gets once merged: before, only ``eval.kwargs`` as
    written was, so an empty ``eval.kwargs`` under ``env.kwargs: {split: test}`` trained
    and selected on the test split, and ``final_kwargs: {split: train}`` was accepted."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig.parse(data)
    cfg = TrainConfig.parse({})
    assert (cfg.eval_kwargs()["split"], cfg.final_kwargs()["split"]) == ("validation", "test")


def test_an_encoder_version_refused_on_a_machine_of_the_scenarios_is_refused():
    """Encoder version 2 read AMD MB values as fractions of 2048: a policy of it is
    refused on the simulated EPYC, which reports its peak, so training one on scenarios
    that may run there is refused at the config, naming the key; on a preset where the
    versions agree it trains. (The env itself still takes it, for studying old policies.)"""
    from envs.scenarios import ScenarioFamily

    old = {"env": {"kwargs": {"encoder_version": 2}}}
    with pytest.raises(
        ConfigError, match=re.escape("env.kwargs.encoder_version: encoder_version 2 ")
    ):
        TrainConfig.parse(old)
    TrainConfig.parse({"env": {"kwargs": {"encoder_version": 2, "preset": "gold6130"}}})
    assert "epyc7302p" in ScenarioFamily("random", "train").machines()
    assert ScenarioFamily("random", "train", "gold6130").machines() == ["gold6130"]


TRACE_ENV = "training.trace_env:rdtune/TracePartition-v0"


def test_a_trace_file_the_config_names_is_refused_naming_its_key(explore_trace, tmp_path):
    """A missing file was a FileNotFoundError with no word of the config; an unusable one
    named the section (env.kwargs) but not the entry."""
    missing, text = tmp_path / "gone.parquet", tmp_path / "notes.parquet"
    text.write_text("not a trace\n")
    for traces, key, problem in (
        ([explore_trace.path, str(missing)], "traces[1]", f"trace {missing}: no such file"),
        ([str(text)], "traces[0]", f"trace {text}: not a Parquet file"),
    ):
        data = {"env": {"id": TRACE_ENV, "kwargs": {"traces": traces}}}
        with pytest.raises(ConfigError) as err:
            TrainConfig.parse(data, "t.yaml")
        assert str(err.value).startswith(f"t.yaml: env.kwargs.{key}: {problem}"), err.value


def _trace_config(traces: list[str], **eval_section) -> dict:
    return {
        "n_envs": 1,
        "ppo": {"n_steps": 32, "batch_size": 32},
        "env": {"id": TRACE_ENV, "kwargs": {"traces": traces, "episode_steps": 4}},
        "eval": eval_section,
    }


def test_a_trace_env_config_holds_out_trace_files(explore_trace, heldout_trace):
    """The trace env takes no split, so the split rules refused every config naming it (or
    its construction did): its held-out data are trace files no run has replayed."""
    train = [explore_trace.path]
    cfg = TrainConfig.parse(_trace_config(train, final_kwargs={"traces": [heldout_trace]}))
    # selection replays the training traces unless told otherwise; no split reaches the env
    assert cfg.eval_kwargs() == {"traces": train, "episode_steps": 4}
    assert cfg.final_kwargs() == {"traces": [heldout_trace], "episode_steps": 4}
    assert TrainConfig.parse(cfg.to_dict()) == cfg  # as config.yaml saves it


@pytest.mark.parametrize("how", ["same", "link", "copy", "selection"])
def test_a_final_table_on_traces_training_or_selection_replayed_is_refused(
    explore_trace, heldout_trace, tmp_path, how
):
    train = explore_trace.path
    final, section, key, words = train, {}, "env.kwargs", "the same file as"
    if how == "same":  # selection on traces of its own does not make the training ones new
        section = {"traces": [heldout_trace]}
    elif how == "link":
        final = tmp_path / "link.parquet"
        final.symlink_to(train)
    elif how == "copy":
        final, words = tmp_path / "copy.parquet", "a copy of"
        shutil.copyfile(train, final)
    elif how == "selection":
        final, section, key = heldout_trace, {"traces": [heldout_trace]}, "eval.kwargs"
    data = _trace_config([train], kwargs=section, final_kwargs={"traces": [str(final)]})
    with pytest.raises(ConfigError) as err:
        TrainConfig.parse(data, "t.yaml")
    other = heldout_trace if how == "selection" else train
    assert str(err.value) == (
        f"t.yaml: eval.final_kwargs.traces[0]: {final} is {words} {key}.traces[0] ({other}): "
        "the final table is the held-out one, played on traces neither training nor "
        "selection replayed; give other recordings"
    )


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({}, "eval.final_kwargs: no traces: the final table is the held-out one"),
        (
            {"kwargs": {"split": "validation"}, "final_kwargs": {"split": "test"}},
            f"eval.kwargs: split 'validation': {TRACE_ENV} has no scenario splits (its "
            "episodes replay recorded traces); select checkpoints on other trace files with "
            "eval.kwargs: {traces: [FILE, ...]}, or on the training ones with {}",
        ),
        ({"final_kwargs": {"split": "test"}}, "eval.final_kwargs: split 'test': "),
    ],
    ids=["no-final-traces", "split", "final-split"],
)
def test_a_trace_env_config_without_held_out_traces_says_what_to_give(
    explore_trace, section, message
):
    with pytest.raises(ConfigError) as err:
        TrainConfig.parse(_trace_config([explore_trace.path], **section), "t.yaml")
    assert str(err.value).startswith(f"t.yaml: {message}"), err.value


REMOTE_ENV = "rdtune/RemotePartition-v0"


def _remote_config(env: dict, **eval_section) -> dict:
    """A config training on an agent (none needs to be up: the env connects lazily)."""
    return {
        "name": "remote",
        "n_envs": 1,
        "ppo": {"n_steps": 32, "batch_size": 32},
        "env": {"id": REMOTE_ENV, "kwargs": {"episode_steps": 4, **env}},
        "eval": eval_section,
    }


@pytest.mark.parametrize(
    ("env", "final"),
    [
        ({"address": "127.0.0.1:50051", "scenario": "default"}, {"scenario": "lc_batch_20"}),
        ({"address": "127.0.0.1:50051"}, {"address": "127.0.0.1:50052"}),
    ],
    ids=["another-scenario", "another-agent"],
)
def test_a_remote_env_config_holds_out_an_agent_or_scenario(env, final):
    """The remote env takes no split, so the split rules refused every config naming it:
    its held-out data are another agent's node, or another scenario of a simulated one."""
    cfg = TrainConfig.parse(_remote_config(env, final_kwargs=final))
    assert cfg.eval_kwargs() == {**env, "episode_steps": 4}
    assert cfg.final_kwargs() == {**env, **final, "episode_steps": 4}


@pytest.mark.parametrize(
    ("env", "section", "message"),
    [
        (
            {"address": "127.0.0.1:50051"},
            {},
            "eval.final_kwargs: the final table would run on the agent '127.0.0.1:50051' with "
            "scenario None, as training does (env.kwargs); it is the held-out one: give "
            "eval.final_kwargs: {scenario: NAME}",
        ),
        (
            {"address": "127.0.0.1:50051", "scenario": "default"},
            {"kwargs": {"scenario": "lc_batch_20"}, "final_kwargs": {"scenario": "lc_batch_20"}},
            "eval.final_kwargs: the final table would run on the agent '127.0.0.1:50051' with "
            "scenario 'lc_batch_20', as checkpoint selection does (eval.kwargs)",
        ),
        (
            {"address": "127.0.0.1:50051", "split": "train"},
            {},
            f"env.kwargs: split 'train': {REMOTE_ENV} has no scenario splits (its episodes run "
            "on an agent's node); train on the agent of env.kwargs.address",
        ),
    ],
    ids=["same-node", "as-selection", "split"],
)
def test_a_remote_env_config_without_a_held_out_node_says_what_to_give(env, section, message):
    with pytest.raises(ConfigError) as err:
        TrainConfig.parse(_remote_config(env, **section), "t.yaml")
    assert str(err.value).startswith(f"t.yaml: {message}"), err.value


@pytest.mark.parametrize("env", ["trace", "remote"])
def test_dagger_needs_the_simulator(env, explore_trace, heldout_trace):
    """The oracle DAgger imitates reads the simulator's ground truth: refused here, not
    raised as a traceback once the run has begun."""
    if env == "trace":
        data = _trace_config([explore_trace.path], final_kwargs={"traces": [heldout_trace]})
    else:
        data = _remote_config({"address": "127.0.0.1:50051"}, final_kwargs={"scenario": "x"})
    with pytest.raises(ConfigError) as err:
        TrainConfig.parse({**data, "dagger": {"iterations": 1}}, "t.yaml")
    assert str(err.value).startswith(
        "t.yaml: dagger: the safe oracle DAgger imitates needs the simulator's ground truth, "
        f"which {data['env']['id']} does not have ("
    )


def test_remote_envs_do_not_share_one_agent():
    data = _remote_config({"address": "127.0.0.1:50051"}, final_kwargs={"scenario": "x"})
    with pytest.raises(ConfigError, match="n_envs: 2 envs of rdtune/RemotePartition-v0 would"):
        TrainConfig.parse({**data, "n_envs": 2}, "t.yaml")


def test_rdtune_train_on_an_agent(tmp_path):
    """Training on a live (simulated) agent, the final table on another of its scenarios."""
    import json

    from agent.sim import SimNode
    from tests.agent.server.conftest import serve
    from tests.training.tiny_runs import TINY
    from training.train import train

    with serve(SimNode("default", seed=0)) as server:
        env = {"address": server.address, "scenario": "default", "interval_s": 0.5}
        data = {
            **TINY,
            **_remote_config(
                env,
                freq=0,
                episodes=1,
                final_episodes=1,
                controllers=["eq"],
                final_kwargs={"scenario": "lc_batch_20"},
            ),
            "total_timesteps": 32,
            "output_dir": str(tmp_path / "run"),
        }
        result = train(TrainConfig.parse(data))
    table = json.loads((result.run_dir / "eval.json").read_text())
    assert table["eval_kwargs"]["scenario"] == "lc_batch_20"
    assert table["selection_kwargs"]["scenario"] == "default"
    assert {r["name"] for r in table["rows"]} == {"policy", "eq"}


def test_defaults_and_round_trip():
    cfg = TrainConfig.parse({"name": "x", "ppo": {"learning_rate": 1e-3}})
    assert cfg.output_dir == "runs/x"
    assert cfg.ppo["learning_rate"] == 1e-3 and cfg.ppo["n_epochs"] == 10
    again = TrainConfig.parse(cfg.to_dict())
    assert again == cfg


def test_training_envs_are_batched_where_the_env_has_a_vector_entry_point(tmp_path):
    """Partition-v0 trains on its vector env by default; an env without a vector entry
    point (the trace-driven one) falls back to SB3's vectorisation of single envs."""
    from training.trace_env import TRACE_PARTITION_ID

    assert TrainConfig.parse({}).vectorization() == "batched"
    assert TrainConfig.parse({"subproc": True}).vectorization() == "subproc"
    assert TrainConfig.parse({"vec_env": "dummy"}).vectorization() == "dummy"
    cfg = TrainConfig.parse({})
    # (model_copy skips validation: parsing would build the env, which needs a trace file)
    cfg = cfg.model_copy(update={"env": cfg.env.model_copy(update={"id": TRACE_PARTITION_ID})})
    assert cfg.vectorization() == "dummy"
    with pytest.raises(ConfigError, match="has none"):
        cfg.model_copy(update={"vec_env": "batched"})._check_vec_env()


@pytest.mark.parametrize(
    "policy", [{"head": "dense", "head_hidden": 64}, {**SLOT_POLICY, "head_hidden": 999}]
)
def test_head_hidden_is_taken_where_it_is_used_or_stated_at_its_default(policy):
    """A dense run's config.yaml states the default (every run writes every key): it must
    still read back, as must a slots head of any size."""
    cfg = TrainConfig.parse({"policy": policy})
    assert cfg.with_overrides({"seed": 1}).policy.head_hidden == policy["head_hidden"]


def test_a_runtime_shield_over_the_training_shield_is_accepted():
    cfg = TrainConfig.parse(
        {"env": {"kwargs": {"shield": {"high": 0.95}}}, "runtime": {"shield": {"give_up": 3}}}
    )
    assert cfg.runtime.shield == {"give_up": 3}


def test_an_evaluation_env_may_restate_the_training_layout():
    cfg = TrainConfig.parse(
        {"env": {"kwargs": {"max_groups": 4}}, "eval": {"kwargs": {"max_groups": 4}}}
    )
    assert cfg.eval_kwargs()["max_groups"] == 4


def test_overrides_apply_and_revalidate():
    cfg = TrainConfig.parse({"name": "x"})
    new = cfg.with_overrides({"seed": 7, "ppo.learning_rate": 0.01, "env.kwargs.episode_steps": 4})
    assert (new.seed, new.ppo["learning_rate"], new.env_kwargs()["episode_steps"]) == (7, 0.01, 4)
    assert cfg.seed == 0  # the original is untouched
    with pytest.raises(ConfigError, match=r"ppo\.learning_rate"):
        cfg.with_overrides({"ppo.learning_rate": "fast"})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"bogus": 1}, "bogus: unknown key; allowed: algorithm, dagger, env"),
        ({"algorithm": "DQN"}, "algorithm: must be 'PPO' or 'MaskablePPO', got 'DQN'"),
        ({"seed": "x"}, "seed: must be a valid integer, got 'x'"),
        ({"n_envs": 0}, "n_envs: must be greater than or equal to 1, got 0"),
        ({"subproc": "yes"}, "subproc: must be a valid boolean, got 'yes'"),
        ({"normalize_obs": "false"}, "normalize_obs: must be a valid boolean, got 'false'"),
        ({"eval": {"heuristics_at_start": "false"}}, "eval.heuristics_at_start: must be a valid"),
        ({"ppo": {"lr": 1}}, "ppo.lr: unknown key; allowed: batch_size"),
        ({"ppo": {"learning_rate": -1}}, "ppo.learning_rate: must be greater than or equal to 0"),
        ({"ppo": {"n_steps": 1.5}}, "ppo.n_steps: must be a valid integer, got 1.5"),
        ({"vec_env": "ray"}, "vec_env: must be 'auto', 'batched', 'dummy' or 'subproc'"),
        ({"subproc": True, "vec_env": "batched"}, "subproc: true contradicts vec_env: batched"),
        ({"rollout_workers": -1}, "rollout_workers: must be greater than or equal to 0"),
        ({"rollout_workers": 3, "n_envs": 2}, "rollout_workers: 3 workers for 2 envs"),
        ({"rollout_workers": 1, "vec_env": "dummy"}, "rollout_workers: Ray rollout workers"),
        ({"env": {"kwargs": {"split": "nope"}}}, "env.kwargs: split must be one of"),
        ({"env": {"kwargs": {"bogus": 1}}}, "env.kwargs: .*bogus"),
        ({"env": {"kwargs": {"seed": 5}}}, "env.kwargs: the run's seed seeds the envs"),
        ({"env": {"id": "nope/Nothing-v0"}}, "env.id"),
        ({"env": {"reward_weights": {"slo": -1}}}, "env.reward_weights: reward weight slo"),
        ({"env": {"reward_weights": {"speed": 1}}}, "env.reward_weights: unknown reward"),
        ({"eval": {"kwargs": {"split": "nope"}}}, "eval.kwargs: split must be one of"),
        ({"eval": {"episodes": 0}}, "eval.episodes"),
        ({"eval": {"final_episodes": 0}}, "eval.final_episodes"),
        ({"eval": {"final_kwargs": {"split": "nope"}}}, "eval.final_kwargs: split must be one"),
        ({"eval": {"controllers": "eq"}}, "eval.controllers: must be a valid list"),
        ({"eval": {"controllers": ["eq", "nope"]}}, "eval.controllers: unknown controller 'nope'"),
        (
            {"eval": {"controllers": ["eq[seed={]"]}},
            "eval.controllers: bad value for option 'seed' in 'eq[seed={]'",
        ),
        ({"eval": {"controllers": ["eq["]}}, "eval.controllers: bad controller spec 'eq['"),
        # refused at load, not by the table after training ("not available")
        (
            {"eval": {"controllers": ["eq[foo=1]"]}},
            "eval.controllers: controller 'eq.foo=1.': unknown option.s. foo",
        ),
        (
            {"eval": {"controllers": ["policy:/nonexistent/export"]}},
            "eval.controllers: .*policy /nonexistent/export: no such file or directory",
        ),
        ({"eval": {"select": "best"}}, "eval.select"),
        ({"policy": {"activation": "gelu"}}, "policy.activation"),
        ({"policy": {"extractor": {"pool": ["sum"]}}}, "policy.extractor.pool"),
        ({"policy": {"net_arch": {"pi": [0]}}}, "policy.net_arch.pi"),
        ({"policy": {"net_arch": {"qf": [8]}}}, "policy.net_arch.qf: unknown key; allowed: pi, vf"),
        ({"env": [1, 2]}, "env: expected a mapping"),
        ({"policy": {"head": "wide"}}, "policy.head: must be 'dense' or 'slots', got 'wide'"),
        ({"policy": {"head": "slots"}}, r"policy.net_arch.pi: must be \[\]"),
        ({"policy": {"head": "slots", "extractor": None}}, "needs the group-set extractor"),
        ({"runtime": {"shield": {"give_up": -1}}}, "runtime.shield: .*give_up must be"),
        ({"runtime": {"shield": {"gve_up": 3}}}, r"runtime.shield: .*unknown shield options"),
        # the policy would see floors at run time it never saw in training
        (
            {"runtime": {"shield": {"give_up": 3}}},
            "runtime.shield: the policy trains without a shield (env.kwargs.shield is false)",
        ),
        (
            {"env": {"kwargs": {"shield": False}}, "runtime": {"shield": {}}},
            "runtime.shield: the policy trains without a shield",
        ),
        # a policy is played only on the layout it learned: refused before training, not
        # by the first evaluation after it
        (
            {"eval": {"kwargs": {"split": "validation", "share_levels": 3}}},
            r"eval.kwargs.share_levels: 3 gives checkpoint selection another observation or "
            r"action layout than training's \(env.kwargs.share_levels: 'default'\)",
        ),
        (
            {"env": {"kwargs": {"max_groups": 4}}, "eval": {"kwargs": {"max_groups": 8}}},
            r"eval.kwargs.max_groups: 8 .* \(env.kwargs.max_groups: 4\)",
        ),
        (
            {"eval": {"final_kwargs": {"split": "test", "mba_levels": 2}}},
            "eval.final_kwargs.mba_levels: 2 gives the final table another observation",
        ),
        (
            {"eval": {"final_kwargs": {"split": "test", "share_all": True}}},
            "eval.final_kwargs.share_all: True gives the final table another",
        ),
        # DAgger fits raw features; PPO and the export would feed the actor normalised ones
        (
            {"normalize_obs": True, "dagger": {"iterations": 1}},
            "dagger: the warm start fits the actor on raw observations, and with "
            "normalize_obs: true",
        ),
        # a typo, refused before the envs' arrays fill the memory
        ({"n_envs": 4_096_000_000}, "n_envs: must be less than or equal to 16384"),
        # PPO trains whole rollouts: 1 step would silently be 2 x 64
        (
            {"total_timesteps": 1, "n_envs": 2, "ppo": {"n_steps": 64, "batch_size": 64}},
            "total_timesteps: 1 is less than one rollout (n_envs x ppo.n_steps = 128)",
        ),
        # nor silently round up: before, 300 trained 384 steps and eval.json said 300
        (
            {"total_timesteps": 300, "n_envs": 4, "ppo": {"n_steps": 32, "batch_size": 64}},
            "total_timesteps: 300 is not a whole number of rollouts (n_envs x ppo.n_steps = "
            "4 x 32 = 128); PPO trains whole rollouts and would train 384: use 256 or 384",
        ),
        # the dense head has no hidden layer of that size: before, it was silently ignored
        (
            {"policy": {"head_hidden": 999}},
            "policy.head_hidden: 999 sizes the hidden layer of head 'slots'; head 'dense'",
        ),
    ],
)
def test_bad_config_names_the_key(data, message):
    with pytest.raises(ConfigError) as err:
        TrainConfig.parse(data)
    assert message in str(err.value) or re.search(message, str(err.value)), err.value


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # one sample per minibatch or per rollout: the update fails with non-finite logits
        ({"ppo": {"batch_size": 1}}, "ppo.batch_size: must be greater than or equal to 2"),
        (
            {"n_envs": 1, "ppo": {"n_steps": 1, "batch_size": 2}},
            "ppo.n_steps: a rollout of n_envs x n_steps = 1 sample",
        ),
        (
            {"n_envs": 2, "ppo": {"n_steps": 64, "batch_size": 1000}},
            "ppo.batch_size: 1000 is more than a rollout holds (n_envs x n_steps = 2 x 64",
        ),
        (
            {"n_envs": 2, "ppo": {"n_steps": 64, "batch_size": 48}},
            "ppo.batch_size: 48 does not divide a rollout of n_envs x n_steps = 128",
        ),
        ({"ppo": {"gamma": 2.0}}, "ppo.gamma: must be less than or equal to 1, got 2.0"),
        ({"ppo": {"gae_lambda": 5.0}}, "ppo.gae_lambda: must be less than or equal to 1"),
        ({"seed": 2**32}, f"seed: must be less than or equal to {2**32 - 1}, got {2**32}"),
    ],
)
def test_ppo_settings_that_cannot_train_are_refused(data, message):
    """Settings SB3 would start with and then fail on (or warn about) mid-run."""
    with pytest.raises(ConfigError) as err:
        TrainConfig.parse(data)
    assert str(err.value).startswith(f"config: {message}"), err.value


@pytest.mark.parametrize(
    ("settings", "argv", "message"),
    [
        ("seed: 4294967296\n", [], "seed: must be less than or equal to 4294967295"),
        ("seed: 1\n", ["--seed", "4294967296"], "overrides: seed: must be less than"),
        ("seed: 1\nseed: 2\n", [], "duplicate key 'seed' (line 3)"),
        ("ppo: {batch_size: 1000}\n", [], "ppo.batch_size: 1000 is more than a rollout"),
    ],
    ids=["seed-in-file", "seed-option", "duplicate-key", "batch-size"],
)
def test_cli_refuses_before_writing_a_run(tmp_path, capsys, monkeypatch, settings, argv, message):
    import training.train
    from tuner.cli import main

    def train(*args, **kwargs):
        raise AssertionError("a refused config trained")

    monkeypatch.setattr(training.train, "train", train)
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\n" + settings)
    out = tmp_path / "run"
    assert main(["train", "--config", str(path), "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("algorithm: [unclosed", "not valid YAML"),
        ("- 1\n- 2\n", "expected a mapping at the top level"),
        ("algorithm: A2C\n", "algorithm: must be 'PPO' or 'MaskablePPO'"),
        ("", "the config is empty"),
        ("# nothing set\n", "the config is empty"),
        ("{}\n", "the config is empty"),
    ],
)
def test_load_config_errors_name_the_file(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_config(path)
    assert str(path) in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")


def test_cli_reports_config_errors(tmp_path, capsys):
    from tuner.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text("algorithm: A2C\n")
    assert main(["train", "--config", str(path)]) == 2
    assert "bad.yaml: algorithm: must be 'PPO'" in capsys.readouterr().err


def test_the_run_records_the_command_that_reproduces_it() -> None:
    import argparse

    from training.cli import reproduce_command

    args = argparse.Namespace(config="my cfg.yaml", seed=4, total_timesteps=None, out="elsewhere")
    assert reproduce_command(args) == "rdtune train --config 'my cfg.yaml' --seed 4"


@pytest.mark.parametrize("value", ["0", "-1"])
def test_cli_refuses_fewer_than_one_concurrent_trial(tmp_path, capsys, monkeypatch, value):
    """At argument parsing, before the config is read or a sweep starts."""
    import training.sweep
    from tuner.cli import main

    def run_sweep(*args, **kwargs):
        raise AssertionError("a sweep ran")

    monkeypatch.setattr(training.sweep, "run_sweep", run_sweep)
    argv = ["train", "--config", str(tmp_path / "absent.yaml"), "--sweep", "seeds=0,1"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--max-concurrent", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--max-concurrent: must be >= 1, got {value}" in err and err.count("\n") == 1, err

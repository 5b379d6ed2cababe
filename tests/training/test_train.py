"""Tiny PPO and MaskablePPO runs: outputs, evaluation table, reproducibility."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.training.tiny_runs import SLOT_POLICY, TINY, tiny_config
from training.config import TrainConfig
from training.train import load_model, train

TRACE_ENV = "training.trace_env:rdtune/TracePartition-v0"


def _params(run_dir, algorithm="MaskablePPO", name="model.zip"):
    return load_model(run_dir / name, algorithm).policy.state_dict()


@pytest.mark.xdist_group("tiny_runs")  # the fixture by name: beside its other users (conftest)
@pytest.mark.parametrize("fixture", ["tiny_run", "tiny_ppo_run"])
def test_tiny_run_writes_a_complete_run_directory(request, fixture):
    result = request.getfixturevalue(fixture)
    d = result.run_dir
    for name in ("config.yaml", "run.json", "model.zip", "best_model.zip", "eval.json"):
        assert (d / name).is_file(), name
    assert list((d / "tb").rglob("events.out.tfevents.*"))  # TensorBoard logs
    evals = [json.loads(line) for line in (d / "evaluations.jsonl").read_text().splitlines()]
    assert [e["timesteps"] for e in evals] == [64, 128]  # every eval.freq steps
    assert evals[0]["best"] is True
    assert result.best_step in (64, 128)
    table = json.loads((d / "eval.json").read_text())
    names = {r["name"] for r in table["rows"]}
    assert names == {"policy", "eq"}
    # The final table uses other episodes than checkpoint selection did.
    assert table["seed"] != 1000 and table["episodes"] == 2
    meta = json.loads((d / "run.json").read_text())
    assert meta["actions"]["nvec"] == [4] * 8 + [3] * 8
    assert meta["algorithm"] == ("PPO" if fixture == "tiny_ppo_run" else "MaskablePPO")
    model = load_model(d / "model.zip", meta["algorithm"])
    head = "SlotHead" if fixture == "tiny_ppo_run" else "Linear"
    assert type(model.policy.action_net).__name__ == head
    # no path into the staging directory, gone now, that training on from it would remake
    assert model.tensorboard_log is None
    assert "| policy |" in result.summary()
    # the training log: env steps/s of every rollout + update cycle (evaluations left out)
    cycles = [json.loads(line) for line in (d / "throughput.jsonl").read_text().splitlines()]
    assert [c["timesteps"] for c in cycles] == [64, 128]  # n_steps 32 x 2 envs per cycle
    assert all(c["env_steps"] == 64 and c["env_steps_per_s"] > 0 for c in cycles)
    assert result.throughput.steps == 128
    assert "env steps/s" in result.summary()


def test_the_seed_matters(tmp_path):
    """Another seed, another initial policy (so the equality below is not trivial)."""
    from training.train import build_model, build_vec_env, seed_everything

    states = []
    for seed in (3, 4, 3):
        cfg = tiny_config(tmp_path / str(seed), seed=seed)
        seed_everything(cfg.seed, cfg.torch_threads)
        venv = build_vec_env(cfg)
        states.append(build_model(cfg, venv, None).policy.state_dict())
        venv.close()
    assert any(not torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert all(torch.equal(states[0][k], states[2][k]) for k in states[0])


def test_a_run_on_the_trace_env_plays_its_final_table_on_held_out_traces(
    explore_trace, heldout_trace, tmp_path
):
    """``rdtune train`` over recorded traces: its config could not name the trace env (the
    held-out rule asked for a split the env does not take)."""
    data = {
        **TINY,
        "n_envs": 1,
        "total_timesteps": 32,
        "env": {"id": TRACE_ENV, "kwargs": {"traces": [explore_trace.path], "episode_steps": 4}},
        "eval": {"freq": 0, "episodes": 1, "final_episodes": 1, "controllers": ["eq"],
                 "final_kwargs": {"traces": [heldout_trace]}},
        "output_dir": str(tmp_path / "run"),
    }  # fmt: skip
    result = train(TrainConfig.parse(data))
    table = json.loads((result.run_dir / "eval.json").read_text())
    assert table["selection_kwargs"]["traces"] == [explore_trace.path]
    assert table["eval_kwargs"]["traces"] == [heldout_trace]
    assert {r["name"] for r in table["rows"]} == {"policy", "eq"}
    # Its card names the machine of its traces, and no other: before, it listed every
    # simulated preset, and the tuner ran the policy on an EPYC it never saw.
    from agent.sim import SimNode
    from training.export import export_run

    assert "selection return" in result.summary()  # no validation split of traces
    card = export_run(result.run_dir, tmp_path / "export", parity_observations=4)
    caps = explore_trace.capabilities
    assert card.trained_on.presets == (f"{Path(explore_trace.path).name} ({caps.description})",)
    assert card.trained_on.ways_min == card.trained_on.ways_max == caps.l3.num_ways
    assert card.trained_on.problems(caps) == []
    epyc = SimNode("more_lc_than_closids_epyc", 0).capabilities()
    assert card.trained_on.problems(epyc)
    assert card.limitations[0].startswith("Trained on recorded traces")
    # the cadence it decided at (the env's) and the traces' own: before, neither was said
    assert card.env["interval_s"] == 1.0 and card.env["trace_interval_s"] == [0.1]
    assert "one decision every 1 s" in card.intended_use
    assert "recorded every 0.1 s" in card.limitations[0]


def test_a_trace_run_refuses_controllers_its_node_cannot_run_before_training(
    explore_trace, heldout_trace, tmp_path
):
    """Whether a controller runs on the evaluation env's node depends on the node: on a
    trace, static cannot calibrate and the oracle has no ground truth. Before, the run
    trained to the end and its final table left them out."""
    from agent.configfile import ConfigError

    data = {
        **TINY,
        "n_envs": 1,
        "total_timesteps": 32,
        "env": {"id": TRACE_ENV, "kwargs": {"traces": [explore_trace.path], "episode_steps": 4}},
        "eval": {"freq": 0, "episodes": 1, "final_episodes": 1, "heuristics_at_start": False,
                 "controllers": ["eq", "static", "oracle", "static[ways=4]"],
                 "final_kwargs": {"traces": [heldout_trace]}},
        "output_dir": str(tmp_path / "run"),
    }  # fmt: skip
    with pytest.raises(ConfigError) as err:
        train(TrainConfig.parse(data))
    text = str(err.value)
    assert text.startswith("eval.controllers: static, oracle cannot run on ")
    assert "give lc_group and ways in its options" in text and "ground truth" in text
    assert not (tmp_path / "run").exists()


def test_a_model_built_without_a_log_directory_leaves_no_files(tmp_path, monkeypatch):
    """``build_model(..., None)`` (the training benchmark's) learns without making SB3's
    ``SB3-<time>`` directory."""
    from training.train import build_model, build_vec_env, seed_everything

    monkeypatch.setenv("SB3_LOGDIR", str(tmp_path / "sb3"))
    cfg = tiny_config(tmp_path / "run")
    seed_everything(cfg.seed, cfg.torch_threads)
    venv = build_vec_env(cfg)
    try:
        model = build_model(cfg, venv, None)
        model.learn(total_timesteps=64)
    finally:
        venv.close()
    assert model.num_timesteps >= 64
    assert not (tmp_path / "sb3").exists()


def test_flat_mlp_policy_without_extractor(tmp_path):
    cfg = tiny_config(tmp_path / "flat", policy={"extractor": None}, total_timesteps=64)
    result = train(cfg, final_eval=False)
    policy = load_model(result.run_dir / "model.zip", "MaskablePPO").policy
    assert type(policy.features_extractor).__name__ == "FlattenExtractor"
    assert result.rows == []


@pytest.mark.parametrize(("obs", "reward"), [(True, False), (False, True), (True, True)])
def test_vecnormalize_options(tmp_path, obs, reward):
    from stable_baselines3.common.vec_env import VecNormalize

    from training.train import build_vec_env

    venv = build_vec_env(tiny_config(tmp_path, normalize_obs=obs, normalize_reward=reward))
    assert isinstance(venv, VecNormalize)
    assert (venv.norm_obs, venv.norm_reward) == (obs, reward)
    venv.close()


def test_rdtune_train_twice_gives_the_same_curve_and_exported_policy(tmp_path):
    """``rdtune train --config F --seed S`` twice, with what the default config uses
    (the batched vector env, reward normalisation, the shared per-slot head):
    the same learning curve (every checkpoint evaluation), checkpoints and exported ONNX
    policy."""
    import yaml

    from tests.training.tiny_runs import TINY
    from training.export import export_run
    from tuner.cli import main

    config = dict(TINY, normalize_reward=True, policy=SLOT_POLICY)
    config["total_timesteps"] = 128
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    runs = []
    for k in range(2):
        out = tmp_path / f"run{k}"
        argv = ["train", "--config", str(path), "--seed", "5", "--out", str(out), "--no-progress"]
        assert main(argv) == 0
        export_run(out, tmp_path / f"export{k}", parity_observations=4)
        runs.append(out)
    curves = [(r / "evaluations.jsonl").read_text().splitlines() for r in runs]
    assert len(curves[0]) == 2 and curves[0] == curves[1]
    assert json.loads(curves[0][0])["episodes"] == 1
    for name in ("model.zip", "best_model.zip"):
        a, b = _params(runs[0], "MaskablePPO", name), _params(runs[1], "MaskablePPO", name)
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    onnx = [(tmp_path / f"export{k}" / "policy.onnx").read_bytes() for k in range(2)]
    assert onnx[0] == onnx[1]
    tables = [json.loads((r / "eval.json").read_text()) for r in runs]
    assert tables[0]["rows"] == tables[1]["rows"]
    assert tables[0]["eval_kwargs"]["split"] == "test"
    assert tables[0]["selection_kwargs"]["split"] == "validation"


@pytest.mark.parametrize("head", ["slots", "flat"])
def test_non_finite_action_logits_stop_training_with_a_clear_error(tmp_path, head):
    """torch's distribution argument checks are off while training (their cost is a tenth
    of PPO's); the action head's own check still stops NaN logits."""
    from training.train import build_model, build_vec_env, seed_everything

    cfg = tiny_config(tmp_path / head, **({"policy": SLOT_POLICY} if head == "slots" else {}))
    seed_everything(cfg.seed, cfg.torch_threads)
    venv = build_vec_env(cfg)
    try:
        model = build_model(cfg, venv, None)
        obs = torch.as_tensor(venv.reset(), dtype=torch.float32)
        model.policy(obs)  # finite: fine
        with torch.no_grad():
            next(model.policy.action_net.parameters()).fill_(float("nan"))
        with pytest.raises(ValueError, match="not finite"):
            model.policy(obs)
    finally:
        venv.close()


@pytest.mark.xdist_group("tiny_runs")
def test_select_last_keeps_the_model_after_the_final_update(tmp_path) -> None:
    # eval.select: last with eval.freq: 0 - one evaluation, at the end, of the model every
    # update made; it is what best_model.zip holds (and what export takes by default)
    from tests.training.tiny_runs import TINY

    cfg = tiny_config(tmp_path / "run", eval={**TINY["eval"], "freq": 0, "select": "last"})
    result = train(cfg, final_eval=False)
    d = result.run_dir
    evals = [json.loads(x) for x in (d / "evaluations.jsonl").read_text().splitlines()]
    assert [(e["timesteps"], e["best"]) for e in evals] == [(128, True)]
    assert result.best_step == 128
    kept = load_model(d / "best_model.zip", "MaskablePPO").policy.state_dict()
    last = load_model(d / "model.zip", "MaskablePPO").policy.state_dict()
    assert kept.keys() == last.keys()
    assert all(torch.equal(kept[k], last[k]) for k in kept)


# ---------------------------------------------------------------------------- the run directory


def _previous_run(out):
    """A previous run's directory (its files as bytes, to compare after a rerun)."""
    files = {
        "config.yaml": b"name: previous\n",
        "run.json": b'{"name": "previous"}',
        "best_model.zip": b"previous best",
        "model.zip": b"previous model",
        "eval.json": b"{}",
        "evaluations.jsonl": b'{"timesteps": 1}\n',
        "tb/ppo_1/events.out.tfevents.1": b"previous events",
    }
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return files


def _snapshot(out):
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def _dead_pid():
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _tiny_yaml(tmp_path):
    import yaml

    from tests.training.tiny_runs import TINY

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(dict(TINY, total_timesteps=64)))
    return path


@pytest.mark.parametrize(
    ("config", "extra", "message"),
    [
        (
            {},
            ["--ray-address", "no-port-here"],
            "not a Ray address: 'no-port-here'; give HOST:PORT",
        ),
        (
            {},
            ["--ray-address", "127.0.0.1:9", "--rollout-workers", "0"],
            "--ray-address 127.0.0.1:9 with --rollout-workers 0: nothing would run there",
        ),
        (
            {"vec_env": "dummy"},
            ["--ray-address", "local"],
            "--ray-address local runs the envs on Ray rollout workers, which hold batched "
            "envs; the config's vec_env is dummy",
        ),
        (
            {},
            ["--ray-address", ""],
            "--ray-address '' is empty: give local or a cluster's HOST:PORT",
        ),
        (
            {},
            ["--ray-address", "", "--sweep", "seeds=0,1"],
            "--ray-address '' is empty: give local or a cluster's HOST:PORT",
        ),
    ],
    ids=["no-port", "no-workers", "dummy-envs", "empty", "empty-sweep"],
)
def test_a_ray_address_that_cannot_be_used_says_why_in_one_line(
    tmp_path, capsys, config, extra, message
):
    """Before, the first went to Ray's raw 'Invalid address format' (exit 1), the second
    trained in-process and ignored the address, the third blamed an override never given;
    an empty address (an unset shell variable) trained in-process, without Ray."""
    import yaml

    from tests.training.tiny_runs import TINY
    from tuner.cli import main

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(dict(TINY, total_timesteps=64, **config)))
    out = tmp_path / "run"
    assert main(["train", "--config", str(path), "--out", str(out), "--no-progress", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rdtune train: {message}") and err.count("\n") == 1, err
    assert not out.exists()


@pytest.mark.parametrize("how", ["unreachable_ray", "interrupted", "in_a_kernel", "failed"])
def test_a_run_that_does_not_finish_leaves_the_previous_run_dir_as_it_was(tmp_path, how):
    from tuner.cli import main

    out = tmp_path / "runs" / "run"
    out.mkdir(parents=True)
    _previous_run(out)
    before = _snapshot(out)
    if how == "unreachable_ray":
        argv = ["train", "--config", str(_tiny_yaml(tmp_path)), "--out", str(out)]
        assert main([*argv, "--ray-address", "127.0.0.1:9", "--no-progress"]) == 2
    else:
        error = RuntimeError if how == "failed" else KeyboardInterrupt

        def stop(*_):
            if how != "in_a_kernel":
                raise error("stopped")
            try:  # how numba reports an interrupt that landed in a compiled kernel
                raise KeyboardInterrupt
            except KeyboardInterrupt:  # the interrupt is the SystemError's __context__
                raise SystemError(  # noqa: B904
                    "CPUDispatcher(<function steady>) returned a result with an exception set"
                )

        with pytest.raises(error):
            train(tiny_config(out, total_timesteps=64), on_eval=stop)
    assert _snapshot(out) == before  # byte for byte
    # no staging dir, no lock; a run that stopped or failed with a checkpoint saved keeps
    # it beside OUT
    kept = {"interrupted": "run.interrupted", "in_a_kernel": "run.interrupted"}
    kept["failed"] = "run.failed"
    beside = [kept[how]] if how in kept else []
    assert sorted(p.name for p in out.parent.iterdir()) == ["run", *beside]
    if beside:
        assert (out.parent / kept[how] / "best_model.zip").read_bytes()[:2] == b"PK"


@pytest.mark.parametrize("failing_call", [1, 2], ids=["end-of-learning-eval", "final-table"])
def test_a_run_that_fails_after_learning_keeps_its_checkpoints(
    tmp_path, capsys, monkeypatch, failing_call
):
    """Before, an error in the evaluation as learning ended (eval.freq: 0) or in the final
    table removed the staging directory: every checkpoint of the run with it."""
    import yaml

    import training.evaluate
    from tests.training.tiny_runs import TINY
    from tuner.cli import main

    real, calls = training.evaluate.evaluate_policy, []

    def evaluate_policy(*args, **kwargs):
        calls.append(1)
        if len(calls) == failing_call:
            raise RuntimeError("shape '[-1, 36]' is invalid")
        return real(*args, **kwargs)

    monkeypatch.setattr(training.evaluate, "evaluate_policy", evaluate_policy)
    config = tmp_path / "tiny.yaml"
    tiny = dict(TINY, total_timesteps=64, eval={**TINY["eval"], "freq": 0})
    config.write_text(yaml.safe_dump(tiny))
    out = tmp_path / "run"
    argv = ["train", "--config", str(config), "--out", str(out), "--no-progress"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    kept = tmp_path / "run.failed"
    assert err == (
        "rdtune train: the run failed (RuntimeError: shape '[-1, 36]' is invalid); the "
        f"checkpoints so far are in {kept} (rdtune export --model {kept} --allow-incomplete "
        "exports them)\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.failed", "tiny.yaml"]
    saved = {"model.zip", *(["best_model.zip"] if failing_call == 2 else [])}
    assert saved <= {p.name for p in kept.iterdir()}
    assert (kept / "model.zip").read_bytes()[:2] == b"PK"


@pytest.mark.parametrize("holder", ["live_run", "not_a_run_dir", "the_users_config_dir"])
def test_a_run_into_an_out_it_must_not_touch_is_refused_at_once(tmp_path, capsys, holder):
    import os

    from agent.pidlock import PidLock
    from tuner.cli import main

    out = tmp_path / "run"
    out.mkdir()
    lock = tmp_path / "run.lock"
    held = None
    if holder == "live_run":
        _previous_run(out)
        held = PidLock.take(str(lock))  # a run under way holds the lock
    else:
        (out / "notes.txt").write_text("not a training run")
    config = _tiny_yaml(tmp_path)
    if holder == "the_users_config_dir":  # a config.yaml of their own: it was taken for a run
        config = out / "config.yaml"
        config.write_text(_tiny_yaml(tmp_path).read_text())
    before = _snapshot(out)
    argv = ["train", "--config", str(config), "--out", str(out), "--no-progress"]
    try:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("rdtune train: ")
        assert (f"pid {os.getpid()}" if holder == "live_run" else "not a training run") in err
        assert _snapshot(out) == before
        assert lock.exists() == (holder == "live_run")  # the other run's lock stays
    finally:
        if held is not None:
            held.release()


@pytest.mark.parametrize(
    "where", ["file/run", "/proc/rdtune-run/run"], ids=["under-a-file", "proc"]
)
def test_an_out_where_no_directory_can_be_made_is_named(tmp_path, capsys, where):
    from tuner.cli import main

    (tmp_path / "file").write_text("in the way")
    out = tmp_path / where  # an absolute where replaces tmp_path
    argv = ["train", "--config", str(_tiny_yaml(tmp_path)), "--out", str(out), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"rdtune train: {out}: cannot make a run directory there ("), err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("left", ["nothing", "stale_lock", "staging_dir", "between_renames"])
def test_a_finished_run_replaces_the_previous_one_and_marks_it_finished(tmp_path, left):
    """Left beside OUT by a run that crashed: its lock (a dead pid), its staging dir, or
    (killed between the renames) OUT renamed aside and no OUT; the next run cleans up."""
    from datetime import datetime

    out = tmp_path / "run"
    out.mkdir()
    _previous_run(out)
    (out / "stale.txt").write_text("only in the previous run")
    dead = _dead_pid()
    if left != "nothing":
        (tmp_path / "run.lock").write_text(f"{dead}\n")
    if left in ("staging_dir", "between_renames"):
        staging = tmp_path / f"run.partial-{dead}"
        staging.mkdir()
        (staging / "model.zip").write_bytes(b"half")
    if left == "between_renames":
        out.rename(tmp_path / f"run.old-{dead}")
    result = train(tiny_config(out, total_timesteps=64), final_eval=False)
    assert result.run_dir == out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert not (out / "stale.txt").exists()
    assert sorted(p.name for p in (out / "tb").iterdir()) == ["ppo_1"]  # not ppo_2, ppo_3...
    evals = [json.loads(line) for line in (out / "evaluations.jsonl").read_text().splitlines()]
    assert [e["timesteps"] for e in evals] == [64]
    meta = json.loads((out / "run.json").read_text())
    assert datetime.fromisoformat(meta["finished"]).tzinfo is not None
    assert (out / "model.zip").read_bytes().startswith(b"PK")


def test_a_run_its_user_stops_keeps_its_checkpoints_for_an_export(tmp_path, capsys):
    """Before, Ctrl-C (or SIGTERM) removed the whole staging directory, the best checkpoint
    of hours of training with it."""
    from tuner.cli import main

    out = tmp_path / "run"

    def stop(*_):
        raise KeyboardInterrupt

    with pytest.raises(
        KeyboardInterrupt, match=r"the checkpoints so far are in .*run\.interrupted"
    ):
        train(tiny_config(out, total_timesteps=64), on_eval=stop)
    kept = tmp_path / "run.interrupted"
    assert not out.exists() and (kept / "best_model.zip").is_file()
    argv = ["export", "--model", str(kept), "--out", str(tmp_path / "e")]
    assert main([*argv, "--parity-observations", "8"]) == 2, "an unfinished run is refused"
    assert main([*argv, "--parity-observations", "8", "--allow-incomplete"]) == 0
    capsys.readouterr()


def test_directories_named_like_a_crashed_runs_are_left_alone(tmp_path):
    """Before, a run removed every ``OUT.old-*`` and ``OUT.partial-*`` beside OUT (a backup
    kept by hand among them) and put a kept ``OUT.old-*`` back as OUT, to replace it; now
    only the two names of the run whose lock file it found, a run that died."""
    out = tmp_path / "run"
    kept = {}
    for name in ("run.old-2025", "run.partial-draft", "run.old-keep", "run.old-12x"):
        kept[name] = tmp_path / name
        kept[name].mkdir()
        _previous_run(kept[name])
    before = {name: _snapshot(path) for name, path in kept.items()}
    result = train(tiny_config(out, total_timesteps=64), final_eval=False)
    assert result.run_dir == out and (out / "model.zip").read_bytes().startswith(b"PK")
    assert {name: _snapshot(path) for name, path in kept.items()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, "run"])


def test_a_run_whose_lock_names_its_own_pid_starts(tmp_path):
    """A restarted container's run may have the pid of the one killed before it (pid 1):
    the lock it left names this process, and is no reason to refuse; what that run left
    under this pid is cleaned up."""
    import os

    out = tmp_path / "run"
    out.mkdir()
    _previous_run(out)
    (tmp_path / "run.lock").write_text(f"{os.getpid()}\n")
    (tmp_path / f"run.partial-{os.getpid()}").mkdir()
    result = train(tiny_config(out, total_timesteps=64), final_eval=False)
    assert result.run_dir == out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_symlinked_out_gets_the_run_where_it_points(tmp_path):
    """Before, the link was renamed aside and left there, and a directory took its place."""
    target = tmp_path / "big-disk" / "run"
    target.mkdir(parents=True)
    _previous_run(target)
    link = tmp_path / "run"
    link.symlink_to(target)
    result = train(tiny_config(link, total_timesteps=64), final_eval=False)
    assert link.is_symlink() and link.resolve() == target
    assert (target / "model.zip").read_bytes().startswith(b"PK")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big-disk", "run"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["run"]
    assert result.run_dir in (link, target)


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_checkpoint_is_written_whole_or_not_at_all(tmp_path, error):
    from training.rundir import save_checkpoint

    path = tmp_path / "best_model.zip"
    path.write_bytes(b"previous checkpoint")

    class Model:
        def save(self, f):
            f.write(b"half a zip")
            raise error

    with pytest.raises(type(error)) as raised:
        save_checkpoint(Model(), path)
    assert path.read_bytes() == b"previous checkpoint"
    assert [p.name for p in tmp_path.iterdir()] == ["best_model.zip"]  # no temporary left
    if isinstance(error, OSError):
        assert str(path) in str(raised.value) and "No space left" in str(raised.value)


def test_a_run_on_an_agent_records_the_agents_machine() -> None:
    """The card of a policy trained on an agent's node is that node's machine (before:
    every simulated preset), read when the run starts, while the agent is there."""
    from types import SimpleNamespace

    from agent.sim import SimNode
    from envs import REMOTE_PARTITION_ID
    from models.card import TrainedOn
    from tests.envs.conftest import agent_on_loopback
    from training.train import nodes_of_run

    with agent_on_loopback("default") as server:
        kwargs = {"address": server.address, "scenario": "default"}
        cfg = SimpleNamespace(
            env=SimpleNamespace(id=REMOTE_PARTITION_ID), env_kwargs=lambda: kwargs
        )
        recorded = nodes_of_run(cfg, 4)["trained_on"]
    trained_on = TrainedOn.from_dict(recorded, "run.json")
    caps = SimNode("default", 0).capabilities()
    assert trained_on.presets == (
        f"the node of the agent at {server.address} ({caps.description})",
    )
    assert trained_on.problems(caps) == []
    assert trained_on.problems(SimNode("more_lc_than_closids_epyc", 0).capabilities())


@pytest.mark.parametrize("progress", [True, False])
def test_each_phase_the_bar_does_not_cover_says_one_line(tmp_path, capfd, progress) -> None:
    """Before, the warm start, the evaluations and the final table (two thirds of the
    default run) showed nothing at default verbosity; --no-progress keeps the run quiet."""
    cfg = tiny_config(
        tmp_path / "run",
        total_timesteps=64,
        progress_bar=progress,
        policy=SLOT_POLICY,
        dagger={"iterations": 2, "episodes": 1, "epochs": 1},
    )
    capfd.readouterr()
    train(cfg)
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("rdtune train: ")]
    if not progress:
        assert lines == []
        return
    expected = [
        r"evaluating the heuristics \(eq\) on 1 validation episodes",
        r"warm start: DAgger from the oracle, 2 rounds of 1 episodes",
        r"warm start: round 1/2 done \(agreement with the oracle [\d.]+%\)",
        r"warm start: round 2/2 done \(agreement with the oracle [\d.]+%\)",
        r"step 0: evaluating the policy on 1 validation episodes",
        r"step 64: evaluating the policy on 1 validation episodes",
        r"final table: the checkpoint of step (0|64) and eq on 2 held-out episodes",
    ]
    assert len(lines) == len(expected), lines
    for line, pattern in zip(lines, expected, strict=True):
        assert re.fullmatch("rdtune train: " + pattern, line), line
    assert "rdtune train: " not in out


def test_the_progress_bar_is_drawn_on_stderr(tmp_path, capfd) -> None:
    """On stdout its last frame landed in a redirected log among the run's results."""
    from tests.training.tiny_runs import tiny_config

    capfd.readouterr()
    train(tiny_config(tmp_path / "run", total_timesteps=64, progress_bar=True))
    out, err = capfd.readouterr()
    assert "64/64" in err
    assert "64/64" not in out

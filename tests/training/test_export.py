"""Export: ONNX actions equal the trained policy's deterministic actions; a readable card."""

from __future__ import annotations

import json
import pickle
import zipfile
from datetime import datetime
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from models.card import CARD_FILE, FORMAT, ModelCard
from models.features import ENCODER_VERSION, FeatureEncoder
from training.export import TIE_TOLERANCE, ExportError, _tied, export_run
from training.train import load_model


def test_card_describes_the_policy(tiny_export):
    data = json.loads((tiny_export / CARD_FILE).read_text())
    assert data["format"] == FORMAT
    for section in ("model", "intended_use", "training_data", "evaluation", "limitations"):
        assert data[section], section
    card = ModelCard.read(tiny_export)
    assert card.encoder_version == ENCODER_VERSION
    assert card.features["max_groups"] == 8
    assert len(card.features["names"]) == FeatureEncoder(8).size == 202
    assert card.actions["kind"] == "multidiscrete-share-levels"
    assert card.actions["share_levels"] == 4 and card.actions["mba_levels"] == 3
    assert card.masked is True and card.normalization is None
    on = card.trained_on
    assert on.ways_min <= on.ways_max and on.requires_cat is True
    assert set(on.mba_modes) <= {"percent", "mbps", "amd"}
    assert card.training_config["algorithm"] == "MaskablePPO"
    assert {r["name"] for r in card.evaluation["rows"]} == {"policy", "eq"}
    assert card.parity["observations"] == card.parity["matched"] == 64
    assert "8 resctrl groups" in card.intended_use and card.out_of_scope and card.limitations
    # the cadence it learned, though the config left interval_s to the env's default: the
    # tuner warns when it runs the policy at another
    assert card.env["interval_s"] == 1.0 and "one decision every 1 s" in card.intended_use


def _session(path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path / "policy.onnx"), opts)


def test_exported_actions_match_the_trained_policy(tiny_run, tiny_export):
    """Many observations, including random ones off the training distribution, and
    random masks: the ONNX argmax equals SB3's deterministic masked prediction."""
    model = load_model(tiny_run.run_dir / "best_model.zip", "MaskablePPO")
    sess = _session(tiny_export)
    rng = np.random.default_rng(0)
    space = model.observation_space
    nvec = model.action_space.nvec
    n = 300
    obs = rng.uniform(space.low, space.high, size=(n, space.shape[0])).astype(np.float32)
    masks = rng.random((n, int(nvec.sum()))) < 0.7
    starts = np.concatenate([[0], np.cumsum(nvec)[:-1]])
    masks[:, starts] = True  # at least one valid choice per dimension
    got = sess.run(["action"], {"obs": obs, "action_mask": masks})[0]  # one batch
    for i in range(n):
        want, _ = model.predict(obs[i], deterministic=True, action_masks=masks[i])
        np.testing.assert_array_equal(got[i], want)
        for d, s in enumerate(starts):
            assert masks[i, s + got[i, d]], "a masked-out choice was taken"


def test_unmasked_ppo_export_matches(tiny_ppo_run, tmp_path):
    card = export_run(tiny_ppo_run.run_dir, tmp_path, parity_observations=32)
    assert card.masked is False and card.parity["matched"] == 32
    model = load_model(tiny_ppo_run.run_dir / "best_model.zip", "PPO")
    sess = _session(tmp_path)
    assert [i.name for i in sess.get_inputs()] == ["obs"]
    obs = np.random.default_rng(1).uniform(0, 1, size=(50, model.observation_space.shape[0]))
    got = sess.run(["action"], {"obs": obs.astype(np.float32)})[0]
    want, _ = model.predict(obs.astype(np.float32), deterministic=True)
    np.testing.assert_array_equal(got, want)


def test_export_refuses_what_is_not_a_run(tmp_path):
    with pytest.raises(ExportError, match=r"no run\.json"):
        export_run(tmp_path, tmp_path / "out")


@pytest.mark.parametrize("checkpoint", ["/elsewhere/model.zip", "../run2/best_model.zip"])
def test_export_takes_only_a_checkpoint_of_the_run(tiny_run, tmp_path, checkpoint):
    """Another file would go out under this run's configuration and evaluation."""
    with pytest.raises(ExportError, match="a checkpoint of the run directory, one of"):
        export_run(tiny_run.run_dir, tmp_path / "out", checkpoint=checkpoint)


def test_the_card_evaluates_the_checkpoint_it_exports(tiny_run, tmp_path, capsys):
    """``--evaluate`` evaluates the checkpoint exported (before, always the best), and a
    card never carries a table of another checkpoint."""
    import shutil

    from tuner.cli import main

    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    argv = ["export", "--model", str(run), "--parity-observations", "8"]
    assert main([*argv, "--out", str(tmp_path / "last"), "--checkpoint", "model.zip",
                 "--evaluate", "2"]) == 0  # fmt: skip
    assert json.loads((run / "eval.json").read_text())["checkpoint"] == "model.zip"
    last = ModelCard.read(tmp_path / "last")
    assert last.evaluation is not None and last.evaluation["checkpoint"] == "model.zip"
    assert main([*argv, "--out", str(tmp_path / "best")]) == 0
    assert "rows" not in (ModelCard.read(tmp_path / "best").evaluation or {})
    capsys.readouterr()


def test_export_refuses_another_encoder_version(tiny_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    meta = json.loads((run / "run.json").read_text())
    meta["encoder_version"] = ENCODER_VERSION + 1
    (run / "run.json").write_text(json.dumps(meta))
    with pytest.raises(ExportError, match="encoder"):
        export_run(run, tmp_path / "out")


def test_the_runtime_shield_travels_in_the_card(tiny_run, tiny_export, tmp_path):
    """The config's runtime.shield is what the exported policy runs behind; without it,
    the training env's shield (none for the tiny run)."""
    import shutil

    import yaml

    from models.policy import PolicyController
    from models.shield import ShieldConfig

    assert ModelCard.read(tiny_export).shield is None
    assert PolicyController(tiny_export).shield_config is None
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["runtime"] = {"shield": {"give_up": 3, "retry": 120}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    export_run(run, tmp_path / "out", parity_observations=16)
    card = ModelCard.read(tmp_path / "out")
    assert card.shield == {"give_up": 3, "retry": 120}
    assert card.env["kwargs"].get("shield") in (None, False)  # the training record stays
    shield = PolicyController(tmp_path / "out").shield_config
    assert shield == ShieldConfig(give_up=3, retry=120)


def test_export_cli(tiny_run, tmp_path, capsys):
    from tuner.cli import main

    argv = ["export", "--model", str(tiny_run.run_dir), "--out", str(tmp_path / "e")]
    assert main([*argv, "--parity-observations", "48"]) == 0
    assert (tmp_path / "e" / "policy.onnx").is_file()
    assert "parity: 48/48 actions match" in capsys.readouterr().out
    assert main(["export", "--model", str(tmp_path / "nothing"), "--out", str(tmp_path)]) == 2


@pytest.mark.parametrize("checkpoint", ["best_model.zip", "model.zip"])
def test_observation_normalisation_travels_in_the_card(tmp_path, checkpoint):
    """VecNormalize statistics go into the card, those the exported checkpoint was trained
    with (before, the best checkpoint's went with the last one too); the runtime applies
    them, so it acts on raw observations exactly as the trained policy on normalised ones."""
    import gymnasium as gym

    import envs  # noqa: F401
    from models.policy import PolicyController
    from tests.training.tiny_runs import tiny_config
    from training.rundir import NORMALISATION_OF, load_normalisation
    from training.train import train

    run = train(tiny_config(tmp_path / "run", normalize_obs=True, total_timesteps=64))
    stats = load_normalisation(run.run_dir, checkpoint)
    stats.venv, stats.class_attributes, stats.returns = None, {}, None  # as pickled by SB3
    stale = pickle.loads(pickle.dumps(stats))
    stale.venv, stale.class_attributes, stale.returns = None, {}, None
    # statistics of this checkpoint's own, told apart from the other's whatever the run did
    stats.obs_rms.mean = stats.obs_rms.mean + (0.25 if checkpoint == "model.zip" else 0.0)
    _put_stats(run.run_dir / checkpoint, stats)
    # and beside it another checkpoint's, as a stop between the two files' writes left them
    # before the statistics went into the checkpoint: the checkpoint's own are used
    stale.obs_rms.mean = stale.obs_rms.mean - 1.0
    (run.run_dir / NORMALISATION_OF[checkpoint]).write_bytes(pickle.dumps(stale))
    card = export_run(run.run_dir, tmp_path / "out", checkpoint=checkpoint, parity_observations=32)
    norm = card.normalization
    assert norm is not None and len(norm["mean"]) == FeatureEncoder(8).size
    np.testing.assert_allclose(norm["mean"], stats.obs_rms.mean)
    assert card.parity["matched"] == 32
    model = load_model(run.run_dir / checkpoint, "MaskablePPO")
    ctrl = PolicyController.load(tmp_path / "out")
    meta = json.loads((run.run_dir / "run.json").read_text())
    env = gym.make(meta["env_id"], **meta["env_kwargs"])
    obs, _ = env.reset(seed=2)
    for _ in range(10):
        mask = env.unwrapped.action_masks()
        want, _ = model.predict(stats.normalize_obs(obs), deterministic=True, action_masks=mask)
        np.testing.assert_array_equal(ctrl.act(obs, mask), want)
        obs, _, _, truncated, _ = env.step(want)
        if truncated:
            obs, _ = env.reset()
    env.close()


def _put_stats(checkpoint: Path, stats) -> None:
    """``checkpoint``'s zip with ``stats`` as the statistics it carries."""
    from training.rundir import STATS_ENTRY

    with zipfile.ZipFile(checkpoint) as archive:
        entries = {n: archive.read(n) for n in archive.namelist() if n != STATS_ENTRY}
    with zipfile.ZipFile(checkpoint, "w") as archive:
        for name, data in {**entries, STATS_ENTRY: pickle.dumps(stats)}.items():
            archive.writestr(name, data)


def test_a_run_from_before_the_checkpoint_carried_its_statistics_uses_the_pickle(tmp_path):
    """A checkpoint without the statistics entry (an older run): the pickle beside it."""
    from stable_baselines3.common.running_mean_std import RunningMeanStd

    from training.rundir import NORMALISATION_OF, load_normalisation, save_checkpoint

    class Model:
        def save(self, f) -> None:
            with zipfile.ZipFile(f, "w") as archive:
                archive.writestr("data", "{}")

    save_checkpoint(Model(), tmp_path / "model.zip")
    assert load_normalisation(tmp_path, "model.zip") is None
    stats = RunningMeanStd(shape=(3,))
    (tmp_path / NORMALISATION_OF["model.zip"]).write_bytes(pickle.dumps(stats))
    assert load_normalisation(tmp_path, "model.zip").mean.shape == (3,)
    save_checkpoint(Model(), tmp_path / "model.zip", RunningMeanStd(shape=(5,)))
    assert load_normalisation(tmp_path, "model.zip").mean.shape == (5,)  # the zip's, and
    assert pickle.loads((tmp_path / NORMALISATION_OF["model.zip"]).read_bytes()).mean.shape == (5,)


@pytest.mark.parametrize("corrupt", ["entry", "pickle"])
def test_corrupt_statistics_are_named_where_they_were_read(tmp_path, corrupt):
    """Before, a truncated statistics entry inside the checkpoint's zip was blamed on the
    intact pickle beside it."""
    from stable_baselines3.common.running_mean_std import RunningMeanStd

    from training.export import _normalisation
    from training.rundir import NORMALISATION_OF, STATS_ENTRY, save_checkpoint

    class Model:
        def save(self, f) -> None:
            with zipfile.ZipFile(f, "w") as archive:
                archive.writestr("data", "{}")

    stats = pickle.dumps(RunningMeanStd(shape=(3,)))
    checkpoint = tmp_path / "best_model.zip"
    save_checkpoint(Model(), checkpoint)  # no entry: the pickle beside it is read
    (tmp_path / NORMALISATION_OF["best_model.zip"]).write_bytes(stats[: len(stats) // 2])
    where = tmp_path / NORMALISATION_OF["best_model.zip"]
    if corrupt == "entry":
        (tmp_path / NORMALISATION_OF["best_model.zip"]).write_bytes(stats)  # intact
        with zipfile.ZipFile(checkpoint, "a") as archive:
            archive.writestr(STATS_ENTRY, stats[: len(stats) // 2])
        where = f"{checkpoint} (entry {STATS_ENTRY})"
    with pytest.raises(ExportError) as err:
        _normalisation(tmp_path, "best_model.zip", True)
    assert str(err.value).startswith(f"{where}: cannot load the normalisation statistics (")


class _Logits:
    """A policy whose action logits are its observation (the parts ``_tied`` reads)."""

    def __init__(self) -> None:
        import torch

        self.pi_features_extractor = torch.nn.Identity()
        self.mlp_extractor = type("Mlp", (), {"forward_actor": staticmethod(lambda x: x)})()
        self.action_net = torch.nn.Identity()


@pytest.mark.parametrize(
    ("logits", "mask", "got", "tied"),
    [
        ([0.5, 0.5 - TIE_TOLERANCE / 10, 0.1, 0.2], None, [1, 1], True),  # a float tie
        ([0.5, 0.4, 0.1, 0.2], None, [1, 1], False),  # a real disagreement
        ([0.5, 0.5, 0.3, 0.2], None, [0, 1], False),  # one dimension tied, one not
        ([0.9, 0.5, 0.1, 0.2], [False, True, True, True], [1, 1], True),  # best masked out
    ],
)
def test_parity_forgives_only_ties(logits, mask, got, tied):
    """Two runtimes may break an exact (float-rounding) tie differently; anything else
    counts as a mismatch of the export."""
    obs = np.asarray(logits, dtype=np.float32)
    assert _tied(_Logits(), obs, mask, np.asarray(got), [2, 2]) is tied


@pytest.mark.parametrize(
    ("files", "extra", "message"),
    [
        ({"run.json": "{bad"}, [], "run.json: not valid JSON: Expecting property name"),
        ({"run.json": "[1]"}, [], "run.json: expected a mapping at the top level"),
        ({"config.yaml": "x: ["}, [], "config.yaml: not valid YAML: expected the node content"),
        ({"config.yaml": "x: ["}, ["--evaluate", "1"], "config.yaml: not valid YAML"),
    ],
)
def test_a_corrupt_run_file_is_named(tmp_path, capsys, files, extra, message):
    from tuner.cli import main

    run = tmp_path / "run"
    run.mkdir()
    contents = {"run.json": "{}", "config.yaml": "name: x\n", "best_model.zip": "junk", **files}
    for name, text in contents.items():
        (run / name).write_text(text)
    assert main(["export", "--model", str(run), "--out", str(tmp_path / "out"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rdtune export: {run}/{message}") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.pop("encoder_version"), "run.json: no encoder_version"),
        (lambda m: m["actions"].update(nvec="abc"), "actions.nvec is not a list of positive"),
        (lambda m: m.update(features=None), "run.json: no features.max_groups"),
        (lambda m: m.update(algorithm="A2C"), "run.json: algorithm is not PPO or MaskablePPO"),
        # the checkpoint is MaskablePPO's: SB3 cannot build a PPO from its saved data
        (lambda m: m.update(algorithm="PPO"), "best_model.zip: cannot load the checkpoint as PPO"),
        # the card would have said one input size and the ONNX taken another (--no-check)
        (
            lambda m: m["features"].update(size=m["features"]["size"] + 76),
            "best_model.zip: takes observations of shape",
        ),
    ],
)
def test_a_run_json_edited_by_hand_is_named_not_a_traceback(
    tiny_run, tmp_path, capsys, edit, message
):
    from tuner.cli import main

    run = _copy_run(tiny_run, tmp_path)
    meta = json.loads((run / "run.json").read_text())
    edit(meta)
    (run / "run.json").write_text(json.dumps(meta))
    assert main(["export", "--model", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rdtune export: {run}/") and err.count("\n") == 1, err
    assert message in err


def _copy_run(tiny_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    return run


_ABSENT = object()  # a run.json from a trainer before the marker


def _set_finished(run, value) -> None:
    meta = json.loads((run / "run.json").read_text())
    if value is _ABSENT:
        del meta["finished"]
    else:
        meta["finished"] = value
    (run / "run.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("remove", "finished", "missing"),
    [
        (["model.zip", "eval.json"], _ABSENT, "no model.zip, no eval.json"),  # stopped in DAgger
        (["eval.json"], _ABSENT, "no eval.json"),  # stopped in the final evaluation
        ([], False, "run.json: finished is false"),  # the trainer's marker says so
        ([], "soon", 'run.json: finished is "soon"'),  # not a time
    ],
    ids=["during-training", "during-final-evaluation", "marker-false", "marker-not-a-time"],
)
def test_a_run_that_did_not_finish_is_refused_unless_allowed(
    tiny_run, tmp_path, capsys, remove, finished, missing
):
    from tuner.cli import main

    run = _copy_run(tiny_run, tmp_path)
    for name in remove:
        (run / name).unlink()
    _set_finished(run, finished)
    argv = ["export", "--model", str(run), "--out", str(tmp_path / "out"), "--no-check"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rdtune export: {run}: the run did not finish ({missing}:"), err
    assert "--allow-incomplete" in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()
    assert main([*argv, "--evaluate", "1"]) == 2  # refused before evaluating into the run
    assert not (run / "eval.json").exists() or "eval.json" not in remove
    # allowed: exported, and the card says the run is incomplete
    assert main([*argv, "--allow-incomplete"]) == 0
    card = ModelCard.read(tmp_path / "out")
    assert card.limitations[0].startswith(f"Incomplete run: training did not finish ({missing})")
    assert "total_timesteps (128)" in card.limitations[0]


@pytest.mark.parametrize("marker", ["as written", True])
def test_a_finished_marker_is_enough(tiny_run, tmp_path, marker):
    """A run the trainer marks finished (the time it finished) is exported on the marker
    alone."""
    run = _copy_run(tiny_run, tmp_path)
    written = json.loads((run / "run.json").read_text())["finished"]
    assert datetime.fromisoformat(written).tzinfo is not None
    _set_finished(run, written if marker == "as written" else marker)
    (run / "model.zip").unlink()  # the last checkpoint is not what is exported
    card = export_run(run, tmp_path / "out", check=False)
    assert not card.limitations[0].startswith("Incomplete")


@pytest.mark.parametrize("size", [0, 1024, 50_000, 0.5, 0.9, 0.99, -1])
def test_a_truncated_checkpoint_is_named_not_a_traceback(tiny_run, tmp_path, capsys, size):
    from tuner.cli import main

    run = _copy_run(tiny_run, tmp_path)
    path = run / "best_model.zip"
    data = path.read_bytes()
    cut = int(len(data) * size) if isinstance(size, float) else size % len(data)
    path.write_bytes(data[:cut])
    with pytest.raises(ExportError, match=f"{path}: cannot load the checkpoint"):
        export_run(run, tmp_path / "out", check=False)
    for extra in ([], ["--evaluate", "1"]):  # the evaluation loads it first: checked before
        argv = ["export", "--model", str(run), "--out", str(tmp_path / "out"), *extra]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"rdtune export: {path}: cannot load") and err.count("\n") == 1, err


def _old_export(out):
    out.mkdir()
    (out / "policy.onnx").write_bytes(b"the old policy")
    (out / "model_card.json").write_text('{"old": "card"}')
    return {p.name: p.read_bytes() for p in out.iterdir()}


@pytest.mark.parametrize("where", ["export_onnx", "parity", "card"])
def test_an_interrupted_export_leaves_the_earlier_one(tiny_run, tmp_path, monkeypatch, where):
    """Interrupted anywhere before it is complete, an export over an earlier one leaves
    that one whole (not a new policy.onnx beside the old card), and no staging files."""
    import training.export as export

    out = tmp_path / "out"
    before = _old_export(out)
    real = {"export_onnx": export.export_onnx, "parity": export.parity}

    def interrupted(*args, **kwargs):
        if where in real:
            real[where](*args, **kwargs)  # the work done, then the interruption
        raise KeyboardInterrupt

    if where == "card":
        monkeypatch.setattr(ModelCard, "write", interrupted)
    else:
        monkeypatch.setattr(export, where, interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_run(tiny_run.run_dir, out, parity_observations=4)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_export_replaces_an_earlier_one_whole(tiny_run, tmp_path):
    out = tmp_path / "out"
    _old_export(out)
    link = tmp_path / "current"
    link.symlink_to(out)
    export_run(tiny_run.run_dir, link, parity_observations=4)
    assert link.is_symlink() and sorted(p.name for p in out.iterdir()) == sorted(
        ["policy.onnx", "model_card.json"]
    )
    assert ModelCard.read(out).name == "tiny"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "out"]


def test_a_directory_with_other_files_is_not_replaced(tiny_run, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"holds files other than an export \(notes\.txt\)"):
        export_run(tiny_run.run_dir, tmp_path, check=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize(
    "where", ["file/export", "/proc/rdtune-export/e"], ids=["under-a-file", "proc"]
)
def test_an_out_where_no_export_directory_can_be_made_is_named(tiny_run, tmp_path, where):
    (tmp_path / "file").write_text("in the way")
    out = tmp_path / where  # an absolute where replaces tmp_path
    with pytest.raises(ExportError, match=r"cannot make an export directory there \("):
        export_run(tiny_run.run_dir, out, check=False)


@pytest.mark.parametrize("episodes", ["0", "-1"])
def test_export_refuses_an_evaluation_of_no_episodes(tmp_path, capsys, episodes):
    """Refused at argument parsing, not taken as "no evaluation" and skipped."""
    from tuner.cli import main

    argv = ["export", "--model", str(tmp_path / "run"), "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--evaluate", episodes])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--evaluate: must be >= 1, got {episodes}" in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_that_is_not_a_regular_file_is_refused_not_waited_on(tiny_run, tmp_path):
    import os

    run = _copy_run(tiny_run, tmp_path)
    (run / "best_model.zip").unlink()
    os.mkfifo(run / "best_model.zip")  # the loader opened it and waited for a writer
    with pytest.raises(ExportError, match=r"best_model\.zip: not a regular file"):
        export_run(run, tmp_path / "out", check=False)


def test_evaluate_leaves_the_run_alone_when_the_export_is_refused(tiny_run, tmp_path, capsys):
    # --evaluate rewrote the run's eval.json, then --out was refused
    from tuner.cli import main

    run = _copy_run(tiny_run, tmp_path)
    before = (run / "eval.json").read_bytes()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine\n")
    argv = ["export", "--model", str(run), "--out", str(taken), "--evaluate", "1"]
    assert main(argv) == 2
    assert "holds files other than an export" in capsys.readouterr().err
    assert (run / "eval.json").read_bytes() == before

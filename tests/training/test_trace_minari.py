"""Export to Minari (the optional 'minari' extra) and reading the dataset back."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from models.actions import ActionDecoder
from models.features import FeatureEncoder
from training.trace_minari import episode_arrays, export_minari
from tuner.cli import main

minari = pytest.importorskip("minari")


def test_episode_arrays_line_up(explore_trace) -> None:
    enc, dec = FeatureEncoder(8), ActionDecoder(8)
    a = episode_arrays(explore_trace, enc, dec)
    n = len(explore_trace) - 1
    assert a["observations"].shape == (n + 1, enc.size)
    assert a["actions"].shape == (n, 16) and a["rewards"].shape == (n,)
    assert np.all(np.isfinite(a["rewards"]))
    assert a["truncations"][-1] and not a["truncations"][:-1].any()
    # Each action decodes to the allocation held in the next interval.
    caps = explore_trace.capabilities
    slots = enc.slots(explore_trace.groups)
    for k in (5, 50, 200):
        ways = dec.decode(a["actions"][k], slots, caps).ways
        held = explore_trace.steps[k + 1].allocation
        assert ways == {g: held.get(g, 0).ways for g in slots}


def test_cli_exports_a_loadable_dataset(explore_trace, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Minari warns about every missing piece of metadata
        rc = main(["trace", "export-minari", explore_trace.path, explore_trace.path,
                   "--dataset-id", "rdtune/explore-v0", "--root", str(tmp_path),
                   "--author", "Ops", "--author-email", "ops@example.org"])  # fmt: skip
    assert rc == 0, capsys.readouterr().out
    ds = minari.load_dataset("rdtune/explore-v0")
    assert ds.total_episodes == 2 and ds.total_steps == 2 * (len(explore_trace) - 1)
    ep = next(ds.iterate_episodes())
    assert ep.observations.shape[0] == len(explore_trace)
    assert ds.storage.metadata["author"] == {"Ops"}
    assert ds.storage.metadata["author_email"] == {"ops@example.org"}


def test_the_dataset_recovers_its_environment(explore_trace, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        export_minari([explore_trace], "rdtune/recover-v0", max_groups=6)
        ds = minari.load_dataset("rdtune/recover-v0")
        for eval_env in (False, True):
            env = ds.recover_environment(eval_env=eval_env, episode_steps=2)
            assert env.spec.id == "rdtune/Partition-v0"
            assert env.observation_space == ds.observation_space
            assert env.action_space == ds.action_space
            obs, _ = env.reset(seed=0)
            assert ds.observation_space.contains(obs)
            ep = next(ds.iterate_episodes())
            env.step(ep.actions[0])  # a recorded action is an action of the environment
            env.close()


def test_export_of_a_bad_file_is_a_clear_error(tmp_path, capsys) -> None:
    """Bad input, status 2 (as a bad option): 1 is left for a failure while running."""
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"nope")
    assert main(["trace", "export-minari", str(bad), "--dataset-id", "x/y-v0"]) == 2
    assert f"trace {bad}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (["--max-groups", "2"], "has 4 groups, more than --max-groups 2"),
        (["--dataset-id", "bad id"], "--dataset-id 'bad id': not a Minari id"),
        (["--dataset-id", "rdtune/no-version"], "not a Minari id"),
    ],
)
def test_export_refuses_what_would_lose_groups_or_leave_directories(
    extra: list[str], error: str, explore_trace, tmp_path, monkeypatch, capsys
) -> None:
    root = tmp_path / "root"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    argv = ["trace", "export-minari", explore_trace.path, "--root", str(root)]
    if "--dataset-id" not in extra:
        argv += ["--dataset-id", "rdtune/few-v0"]
    assert main(argv + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("rdtune trace export-minari: ") and err.count("\n") == 1
    assert error in err
    assert not root.exists() or not any(root.iterdir())


def test_export_to_a_datasets_folder_that_is_a_file_says_so(explore_trace, tmp_path, capsys):
    root = tmp_path / "datasets"
    root.write_text("kept\n")
    argv = ["trace", "export-minari", explore_trace.path, "--dataset-id", "rdtune/f-v0"]
    assert main([*argv, "--root", str(root)]) == 2
    err = capsys.readouterr().err  # Minari's own words were "[Errno 17] File exists"
    assert (
        err
        == f"rdtune trace export-minari: the datasets folder {root} is a file, not a directory\n"
    )
    assert root.read_text() == "kept\n"

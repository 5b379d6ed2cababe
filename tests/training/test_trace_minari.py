"""Export to Minari (the optional 'minari' extra) and reading the dataset back."""

from __future__ import annotations

import numpy as np
import pytest

from models.actions import ActionDecoder
from models.features import FeatureEncoder
from training.trace_minari import episode_arrays
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
    rc = main(["trace", "export-minari", explore_trace.path, explore_trace.path,
               "--dataset-id", "rdtune/explore-v0", "--root", str(tmp_path)])  # fmt: skip
    assert rc == 0, capsys.readouterr().out
    ds = minari.load_dataset("rdtune/explore-v0")
    assert ds.total_episodes == 2 and ds.total_steps == 2 * (len(explore_trace) - 1)
    ep = next(ds.iterate_episodes())
    assert ep.observations.shape[0] == len(explore_trace)


def test_export_of_a_bad_file_is_a_clear_error(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"nope")
    assert main(["trace", "export-minari", str(bad), "--dataset-id", "x/y-v0"]) == 1
    assert f"trace {bad}" in capsys.readouterr().err

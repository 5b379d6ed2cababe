"""``--controller policy:PATH``: the tuner refuses, with a clear message, an exported model
whose feature encoder version or trained-on capabilities do not match the node. The model
cards here are written by the tests in the export's format (training/export.py)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from pathlib import Path

import pytest

from agent.sim import SimNode
from models.card import ModelCard, PolicyError, TrainedOn, find_card
from models.features import ENCODER_VERSION
from models.policy import DEFAULT_POLICY
from tests.tuner.conftest import ROOT

BUNDLED = ModelCard.read(DEFAULT_POLICY) if (DEFAULT_POLICY / "model_card.json").is_file() else None
pytestmark = pytest.mark.skipif(BUNDLED is None, reason="no bundled policy to derive cards from")


def card(**on) -> ModelCard:
    """The bundled policy's card, trained on the machines ``on`` describes."""
    trained_on = {
        "max_groups": 8,
        "presets": ("gold6130",),
        "ways_min": 11,
        "ways_max": 20,
        "min_cbm_bits_max": 2,
        "requires_cat": True,
        "mba_modes": ("percent",),
        "trained_without_mba": False,
        **on,
    }
    return dataclasses.replace(BUNDLED, trained_on=TrainedOn(**trained_on))


def later_version(data: ModelCard) -> ModelCard:
    """``data`` as a later build's export would write it: both its encoder versions on."""
    v = ENCODER_VERSION + 1
    return dataclasses.replace(
        data, encoder_version=v, features={**data.features, "encoder_version": v}
    )


def export(
    tmp_path: Path, data: ModelCard | dict | None, onnx: bytes = b"not an onnx model"
) -> Path:
    out = tmp_path / "export"
    out.mkdir()
    (out / "policy.onnx").write_bytes(onnx)
    if isinstance(data, ModelCard):
        data.write(out)
    elif data is not None:
        (out / "model_card.json").write_text(json.dumps(data))
    return out


NODE = SimNode("default").capabilities()  # gold6130: 11 ways, MBA in percent, Intel


def test_a_matching_card_has_no_problems() -> None:
    assert card().problems(NODE) == []


@pytest.mark.parametrize(
    ("changed", "message"),
    [
        ({"encoder_version": 99}, "feature encoder version 99"),
        (
            {"trained_on": TrainedOn(8, ways_min=12)},
            "11 L3 ways outside the model's range [12, 64]",
        ),
        ({"trained_on": TrainedOn(8, ways_max=10)}, "11 L3 ways outside the model's range [1, 10]"),
        ({"trained_on": TrainedOn(8, mba_modes=("mbps",))}, "MBA mode 'percent' not among"),
        ({"trained_on": TrainedOn(8, vendors=("amd",))}, "vendor 'intel' not among the model's"),
    ],
)
def test_mismatches_are_named(changed: dict, message: str) -> None:
    problems = dataclasses.replace(card(), **changed).problems(NODE)
    assert any(message in p for p in problems), problems


def test_node_without_cat_or_mba() -> None:
    bare = dataclasses.replace(NODE, l3=None, mba=None)
    problems = " ".join(card(requires_mba=True).problems(bare))
    assert "needs cache allocation (CAT" in problems
    assert "needs memory bandwidth allocation (MBA)" in problems
    assert "trained only on nodes with MBA" in " ".join(card().problems(bare))


def test_card_is_found_beside_the_onnx_file(tmp_path) -> None:
    out = export(tmp_path, card())
    assert find_card(out) == find_card(out / "policy.onnx") == out / "model_card.json"
    with pytest.raises(PolicyError, match="no such file"):
        find_card(tmp_path / "missing")
    (out / "model_card.json").write_text("{not json")
    with pytest.raises(PolicyError, match=r"model card .* is not valid JSON"):
        ModelCard.read(out)


@pytest.mark.parametrize(
    ("data", "message", "without_the_node"),
    [
        (later_version(card()), "encoder version", True),
        (card(ways_min=16), "11 L3 ways outside the model's range [16, 20]", False),
        (card(mba_modes=("mbps",)), "MBA mode 'percent'", False),
        (None, "no model card", True),
    ],
)
def test_tune_refuses_a_mismatched_policy(
    fresh, tune_here, tmp_path, data, message, without_the_node
) -> None:
    path = export(tmp_path, data, (DEFAULT_POLICY / "policy.onnx").read_bytes())
    run = tune_here(fresh.address, f"policy:{path}", "--intervals", "3")
    assert run.returncode == 2, run.stdout
    assert message in run.stderr
    # What can be refused without the node is refused before the tuner starts (no summary
    # then); a node the policy was not trained for, once the tuner has seen it.
    assert without_the_node == (run.summary is None), run.stdout
    assert without_the_node or run.summary["intervals"] == 0, "no interval ran"


@pytest.mark.parametrize(
    ("signed", "message"),
    [(True, "does not match the card's sha256"), (False, "not an ONNX model (DecodeError)")],
)
def test_tune_refuses_a_matching_card_whose_model_cannot_load(
    fresh, tune_here, tmp_path, signed, message
):
    """policy.onnx is garbage: refused before the tuner starts, by the card's checksum, or
    (the checksum is optional) by parsing it; before, only once ONNX Runtime, after the
    tuner had connected, could not load it."""
    onnx = {**card().onnx, "sha256": card().onnx["sha256"] if signed else None}
    path = export(tmp_path, dataclasses.replace(card(), onnx=onnx))
    run = tune_here(fresh.address, f"policy:{path}", "--intervals", "3")
    assert run.returncode == 2
    assert message in run.stderr and run.summary is None


# An export directory ('rdtune export --out DIR'): $RDTUNE_TEST_POLICY, else the policy
# shipped in models/policies/default once the training engineer's export is there.
SHIPPED = ROOT / "models" / "policies" / "default"
EXPORT = os.environ.get("RDTUNE_TEST_POLICY") or (
    str(SHIPPED) if (SHIPPED / "model_card.json").is_file() else None
)


@pytest.mark.skipif(
    importlib.util.find_spec("models.policy") is None or not EXPORT,
    reason="needs an exported policy: models/policies/default, or RDTUNE_TEST_POLICY set to an "
    "'rdtune export' directory",
)
def test_tune_runs_an_exported_policy(fresh, tune_here) -> None:
    run = tune_here(fresh.address, f"policy:{EXPORT}", "--interval", "0.1", "--intervals", "30")
    assert run.returncode == 0, run.stderr
    assert run.summary["intervals"] == 30
    assert not run.of("dropped")


@pytest.mark.skipif(
    importlib.util.find_spec("models.policy") is None or not EXPORT,
    reason="needs an exported policy: models/policies/default, or RDTUNE_TEST_POLICY set to an "
    "'rdtune export' directory",
)
@pytest.mark.parametrize(
    ("interval", "options", "warned"),
    [
        ("0.2", {}, True),  # the shipped card: trained deciding every 1 s
        ("1", {}, False),
        ("0.2", {"decide_s": 1}, False),  # its own cadence restored by decide_s
        ("0.5", {"decide_s": 2}, True),
    ],
)
def test_tune_warns_once_of_a_policy_run_at_another_cadence(
    fresh, tune_here, interval, options, warned
) -> None:
    """Before, a policy trained at 1 s ran every 0.2 s without a word: its shield's
    interval counts (give_up: 3) then meant 0.6 s."""
    config = {"controller_options": options} if options else None
    run = tune_here(
        fresh.address, f"policy:{EXPORT}", "--interval", interval, "--intervals", "2",
        config=config,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    said = run.of("cadence")
    assert len(said) == int(warned), run.stderr
    if warned:
        trained = ModelCard.read(EXPORT).env["kwargs"]["interval_s"]
        assert said[0]["trained_interval_s"] == trained
        assert f"was trained deciding every {trained:g} s" in said[0]["msg"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: "/dev/zero", "/dev/zero: a character device, not a policy"),
        (lambda tmp: str(tmp / "missing"), "no such file or directory"),
        (lambda tmp: _link(tmp / "dangling", tmp / "gone"), "a broken symbolic link"),
        (lambda tmp: _fifo(tmp / "pipe"), "a named pipe, not a policy"),
        (lambda tmp: _write(tmp / "card.json", b"\xff\xfe\x00"), "is not text"),
        (lambda tmp: _write(tmp / "card.json", b"[1, 2]"), "is not a JSON object"),
        (lambda tmp: _write(tmp / "notes.txt", b"hello"), "no model card"),
    ],
    ids=["char-device", "missing", "dangling-link", "fifo", "binary-card", "list-card", "txt"],
)
def test_bad_policy_paths_say_what_they_are(tmp_path, make, message) -> None:
    with pytest.raises(PolicyError, match=message):
        ModelCard.read(make(tmp_path))


def _link(path, target) -> str:
    path.symlink_to(target)
    return str(path)


def _fifo(path) -> str:
    import os

    os.mkfifo(path)
    return str(path)


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)

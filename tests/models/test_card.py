"""The model card (models/card.py): one format written and read, older cards still read,
the usual sections present, every mismatch with a node named."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest

from agent.sim import SimNode
from models.card import CARD_FILE, FORMAT, ModelCard, PolicyError, TrainedOn
from models.policy import DEFAULT_POLICY
from tests.models.exports import copy_export
from tuner.controllers import ControllerError, check

ON = "training_data.trained_on."
V1 = Path(__file__).parent / "data" / "model_card_v1.json"  # the bundled card as first exported


def test_a_version_1_card_reads_into_the_same_facts_and_gains_the_sections() -> None:
    old = json.loads(V1.read_text())
    card = ModelCard.from_dict(old)
    assert (card.name, card.algorithm, card.created) == (
        old["name"],
        old["algorithm"],
        old["created"],
    )
    assert card.encoder_version == old["encoder_version"]
    assert card.actions["kind"] == old["action_design"]
    assert card.trained_on.as_dict() | {"requires_mba": False} == {
        **old["capabilities"],
        "requires_mba": False,
    }
    assert card.env == old["env"] and card.training_config == old["training"]
    assert card.evaluation["rows"] == old["evaluation"]["rows"]
    assert card.parity == old["parity"]
    assert card.intended_use and card.out_of_scope and card.limitations


def test_written_cards_read_back_equal(tmp_path) -> None:
    card = ModelCard.from_dict(json.loads(V1.read_text()))
    path = card.write(tmp_path)
    assert path.name == CARD_FILE and json.loads(path.read_text())["format"] == FORMAT
    assert ModelCard.read(tmp_path) == card


def test_the_bundled_card_is_current_and_matches_its_onnx_file() -> None:
    data = json.loads((DEFAULT_POLICY / CARD_FILE).read_text())
    assert data["format"] == FORMAT
    card = ModelCard.read(DEFAULT_POLICY)
    onnx = (DEFAULT_POLICY / card.onnx["file"]).read_bytes()
    assert hashlib.sha256(onnx).hexdigest() == card.onnx["sha256"]
    assert card.code_problems() == []
    assert card.problems(SimNode("default").capabilities()) == []
    # the shipped policy says how to train it again
    assert card.command == "rdtune train --config training/configs/default.yaml"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(format="rdtune-policy-card/9"), "format 'rdtune-policy-card/9'"),
        (lambda d: d.pop("limitations"), "has no 'limitations'"),
        (lambda d: d["runtime"].update(encoder_version="1"), "encoder_version is not an integer"),
        (  # read by nothing before: a card edited by hand was accepted
            lambda d: d["runtime"]["features"].update(encoder_version=4),
            r"runtime.features.encoder_version 4 is not runtime.encoder_version \d",
        ),
        (lambda d: d["training_data"]["trained_on"].update(colour=1), "unknown trained-on keys"),
    ],
)
def test_malformed_cards_are_refused_saying_what_is_wrong(tmp_path, edit, message) -> None:
    data = ModelCard.from_dict(json.loads(V1.read_text())).as_dict()
    edit(data)
    (tmp_path / CARD_FILE).write_text(json.dumps(data))
    with pytest.raises(PolicyError, match=message):
        ModelCard.read(tmp_path)


def test_every_mismatch_with_a_node_is_named() -> None:
    caps = SimNode("default").capabilities()  # gold6130: 11 ways, MBA in percent
    on = TrainedOn(4, ways_min=12, mba_modes=("amd",), vendors=("amd",), min_cbm_bits_max=0)
    problems = on.problems(caps)
    assert len(problems) == 4, problems
    no_mba = dataclasses.replace(caps, mba=None)
    assert TrainedOn(4, trained_without_mba=False).problems(no_mba) == [
        "the model was trained only on nodes with MBA; the node has none"
    ]


@pytest.mark.parametrize(
    ("trained", "runtime", "runs_behind"),
    [
        (True, None, True),
        (True, {"give_up": 3}, {"give_up": 3}),
        # before, the runtime's options replaced the training shield's: high and low
        # went back to their defaults at run time
        ({"high": 0.95, "low": 0.7}, None, {"high": 0.95, "low": 0.7}),
        ({"high": 0.95, "low": 0.7}, {"give_up": 3}, {"high": 0.95, "low": 0.7, "give_up": 3}),
        ({"high": 0.95, "give_up": 5}, {"give_up": 3}, {"high": 0.95, "give_up": 3}),
        (False, None, False),
    ],
)
def test_the_runtime_shield_is_the_training_one_with_the_runtime_options_over_it(
    trained, runtime, runs_behind
) -> None:
    card = ModelCard.read(DEFAULT_POLICY)
    env = {**card.env, "kwargs": {**card.env["kwargs"], "shield": trained}}
    card = dataclasses.replace(card, env=env, shield=runtime)
    assert card.runtime_shield() == runs_behind


RT = "runtime."


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model": None}, "model is not a mapping: None"),
        ({"limitations": 5}, "limitations is not a list of strings: 5"),
        ({RT + "onnx": "policy.onnx"}, "runtime.onnx is not a mapping: 'policy.onnx'"),
        ({RT + "onnx.file": 5}, "runtime.onnx.file must name a file beside the card, got 5"),
        ({RT + "onnx.file": "../x/policy.onnx"}, "must name a file beside the card"),
        ({RT + "onnx.file": "/etc/passwd"}, "must name a file beside the card"),
        ({RT + "onnx.sha256": 5}, "runtime.onnx.sha256 is not a sha256 hex digest"),
        ({RT + "onnx.inputs": [1]}, "runtime.onnx.inputs is not a mapping"),
        ({RT + "features.max_groups": 10**9}, r"max_groups is 1000000000, outside \[1, 4096\]"),
        ({RT + "features.max_groups": "x"}, "runtime.features.max_groups is not an integer"),
        ({RT + "actions.share_levels": 10**8}, "share_levels is 100000000, outside"),
        ({RT + "actions.mba_levels": -3}, "mba_levels is -3, outside"),
        ({RT + "masked": "false"}, "runtime.masked is not true or false: 'false'"),
        ({RT + "observation_normalization": "yes"}, "normalization is not a mapping: 'yes'"),
        (
            {RT + "observation_normalization": {"mean": [0.0], "var": [-1.0], "epsilon": 1e-8}},
            "var holds a negative variance",
        ),
        ({"training_data.env.kwargs": [1]}, "training_data.env.kwargs is not a mapping"),
        ({"training_data.env.kwargs.baseline": [1]}, "baseline is \\[1\\]; one of current"),
        ({ON + "requires_mba": "no"}, "trained_on.requires_mba is not true or false"),
        ({ON + "presets": None}, "trained_on.presets is not a list of strings"),
        ({"training_data.trained_on": []}, "training_data.trained_on is not a mapping"),
    ],
)
def test_each_field_of_a_hand_edited_card_is_checked_before_a_node_is_touched(
    tmp_path, changes, message
) -> None:
    """Refused by the check the tuner runs before it connects (tuner/controllers.py), in
    one line naming the card's file and the field, never a traceback from deep in the
    runtime, and never after building a layout or an action table of gigabytes."""
    export = copy_export(DEFAULT_POLICY, tmp_path / "p", **changes)
    with pytest.raises(ControllerError, match=message) as refused:
        check(f"policy:{export}")  # loads the policy as it will run: the loader's error
    assert isinstance(refused.value.__cause__, PolicyError)
    assert str(export / CARD_FILE) in str(refused.value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {
                RT + "observation_normalization": {
                    "mean": [0.0],
                    "var": [1.0],
                    "epsilon": 1e-8,
                    "clip": 10.0,
                }
            },
            "the observation normalisation has 1 values, the features",
        ),
        ({RT + "shield": {"bogus": 1}}, r"the shield it runs behind: unknown shield options"),
    ],
)
def test_a_card_this_code_cannot_serve_is_refused_before_a_node_is_touched(
    tmp_path, changes, message
) -> None:
    export = copy_export(DEFAULT_POLICY, tmp_path / "p", **changes)
    assert any(message.split(":")[0] in p for p in ModelCard.read(export).code_problems())
    with pytest.raises(ControllerError, match=message) as refused:
        check(f"policy:{export}")
    assert isinstance(refused.value.__cause__, PolicyError)


@pytest.mark.parametrize("kind", ["missing", "a directory", "a named pipe", "another file"])
def test_the_onnx_file_is_checked_before_a_node_is_touched(tmp_path, kind) -> None:
    """A pipe in place of the ONNX file is refused at once (reading it would wait for a
    writer), as are a directory, a missing file and a file that is not the card's."""
    export = copy_export(DEFAULT_POLICY, tmp_path / "p")
    onnx = export / "policy.onnx"
    onnx.unlink()
    if kind == "a directory":
        onnx.mkdir()
    elif kind == "a named pipe":
        os.mkfifo(onnx)
    elif kind == "another file":
        onnx.write_bytes(b"not the policy")
    message = {
        "missing": "cannot read the ONNX policy: .*: cannot read: No such file",
        "another file": "does not match the card's sha256",
    }.get(kind, f"cannot read the ONNX policy: .*: {kind}, not a regular file")
    with pytest.raises(ControllerError, match=message) as refused:
        check(f"policy:{export}")
    assert isinstance(refused.value.__cause__, PolicyError)
    assert str(onnx) in str(refused.value)


@pytest.mark.parametrize(
    ("version", "scenario", "refused"),
    [
        (1, "more_lc_than_closids_epyc", True),  # AMD, reports its peak (150 GB/s)
        (2, "more_lc_than_closids_epyc", True),
        (3, "more_lc_than_closids_epyc", False),
        (2, "default", False),  # Intel: MB values are percentages in every version
    ],
)
def test_a_policy_reading_amd_mb_values_of_2048_is_refused_where_the_peak_is_known(
    version: int, scenario: str, refused: bool
) -> None:
    from models.features import refused_on

    caps = SimNode(scenario).capabilities()
    why = refused_on(version, caps)
    assert bool(why) == refused and ("retrain" in why) == refused
    assert refused_on(version, dataclasses.replace(caps, memory_bandwidth_bps=None)) == ""


@pytest.mark.parametrize("scenario", ["more_lc_than_closids_epyc", "default"])
def test_a_version_2_policy_controller_refuses_the_amd_node_that_reports_its_peak(
    tmp_path, scenario: str
) -> None:
    """The bundled policy with its card saying version 2 (the layout is version 3's): the
    controller itself refuses to start on the simulated EPYC, as the catalogue's check does,
    and starts on the Intel preset, where the versions encode alike."""
    from models.controller import context
    from models.policy import PolicyCompatibilityError, PolicyController, check_export

    old = copy_export(
        DEFAULT_POLICY,
        tmp_path / "v2",
        **{"runtime.encoder_version": 2, "runtime.features.encoder_version": 2},
    )
    node = SimNode(scenario)
    ctl = PolicyController(old)
    if scenario == "default":
        ctl.start(context(node))
        check_export(old, node.capabilities())
        return
    with pytest.raises(PolicyCompatibilityError, match="encoder version 2 read AMD MB values"):
        ctl.start(context(node))
    with pytest.raises(PolicyCompatibilityError, match="encoder version 2 read AMD MB values"):
        check_export(old, node.capabilities())

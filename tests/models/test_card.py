"""The model card (models/card.py): one format written and read, older cards still read,
the usual sections present, every mismatch with a node named."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from agent.sim import SimNode
from models.card import CARD_FILE, FORMAT, ModelCard, PolicyError, TrainedOn
from models.policy import DEFAULT_POLICY

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

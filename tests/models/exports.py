"""Copies of an exported policy with keys of its model card changed: what the policy
runtime's and the shield's tests run instead of the shipped card."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any


def copy_export(src: Path, dst: Path, **card_changes: Any) -> Path:
    """A copy of the export ``src`` at ``dst`` with keys of its card (dotted paths, format
    2, e.g. ``runtime.shield``) set to new values."""
    shutil.copytree(src, dst)
    card = json.loads((dst / "model_card.json").read_text())
    for key, value in card_changes.items():
        node = card
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        node[last] = value
    (dst / "model_card.json").write_text(json.dumps(card))
    return dst


def resign(export: Path) -> Path:
    """Set the card's sha256 to that of the export's ONNX file as it is now, as the policy
    loader computes it (models/policy.py): a changed file then loads past the checksum."""
    import hashlib

    card = json.loads((export / "model_card.json").read_text())
    onnx = export / card["runtime"]["onnx"]["file"]
    card["runtime"]["onnx"]["sha256"] = hashlib.sha256(onnx.read_bytes()).hexdigest()
    (export / "model_card.json").write_text(json.dumps(card))
    return export


def non_finite_export(src: Path, dst: Path, value: float = float("nan")) -> Path:
    """A copy of the export ``src`` at ``dst`` whose every floating-point initializer (its
    weights) is ``value``, its card's sha256 updated to match."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    copy_export(src, dst)
    path = dst / "policy.onnx"
    model = onnx.load(path)
    for i, t in enumerate(model.graph.initializer):
        w = numpy_helper.to_array(t)
        if np.issubdtype(w.dtype, np.floating):
            bad = numpy_helper.from_array(np.full_like(w, value), t.name)
            model.graph.initializer[i].CopyFrom(bad)
    onnx.save(model, path)
    return resign(dst)

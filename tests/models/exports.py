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

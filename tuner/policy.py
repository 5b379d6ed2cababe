"""Loading an exported policy for ``rdtune tune --controller policy:PATH``, refusing a model
that does not fit the node (issue 8, "Service").

The policy runtime is ``models.policy.PolicyController`` (owned by the models package); the
tuner does not run ONNX itself. Before loading it the tuner reads the model card that
ships with the export and refuses, with a message naming every mismatch, a model whose

* feature encoder version differs from this build's ``models.features.ENCODER_VERSION``
  (the policy would be fed features it was not trained on; ARCHITECTURE.md, "Data flow"), or
* supported capabilities do not cover the node: CAT / MBA it needs and the node lacks,
  an MBA mode, a vendor or a way count outside what it was trained on.

Interface (what the tuner needs from an export; training/export.py writes it):

* ``PATH`` is the export directory, its ``.onnx`` file or its card; the card is the JSON
  file beside the ONNX file (``model_card.json``, ``card.json`` or ``<stem>.json``);
* the card holds the encoder version as ``encoder_version`` (top level, or inside
  ``features`` / ``feature_encoder``), and the capabilities the policy was trained on as
  ``capabilities`` (or ``supported_capabilities``) with any of ``requires_cat``,
  ``requires_mba`` (bools), ``mba_modes`` (the MBA modes seen; a node with another mode is
  refused), ``trained_without_mba`` (false: a node without MBA is refused), ``ways_min`` /
  ``ways_max``, ``min_cbm_bits_max``, ``vendors``, ``num_ways`` (a list or ``{min, max}``),
  ``max_groups`` (groups beyond it are left untouched: a warning, not a refusal);
* ``PolicyController.load(path)`` returns a :class:`models.controller.Controller`; when it
  has ``check_compatible(caps)`` that is called too, and its refusal is the tuner's.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from agent.types import NodeCapabilities
from models.controller import Controller

log = logging.getLogger("rdtune.tuner")

CARD_NAMES = ("model_card.json", "card.json")


class PolicyRefused(ValueError):
    """The model cannot control this node (or cannot be loaded); the message says why."""


WHAT_TO_GIVE = "give the export directory, its .onnx file or its model card"
MAX_CARD_BYTES = 16 << 20


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _check_path(path: str | Path) -> Path:
    """``path`` as a Path when it names a directory or a regular file we may read; else
    :class:`PolicyRefused` saying what it is instead (a device, a broken link, ...)."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        if p.is_symlink():
            raise PolicyRefused(
                f"policy {path}: a broken symbolic link (to {os.readlink(p)}); {WHAT_TO_GIVE}"
            ) from None
        raise PolicyRefused(f"policy {path}: no such file or directory") from None
    except PermissionError:
        raise PolicyRefused(f"policy {path}: permission denied") from None
    except OSError as exc:
        raise PolicyRefused(f"policy {path}: cannot access: {exc.strerror}") from None
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        raise PolicyRefused(f"policy {path}: {_kind(st.st_mode)}, not a policy; {WHAT_TO_GIVE}")
    if not os.access(p, os.R_OK | (os.X_OK if stat.S_ISDIR(st.st_mode) else 0)):
        raise PolicyRefused(f"policy {path}: permission denied")
    return p


def find_card(path: str | Path) -> Path:
    """The model card of an export given as a directory, an .onnx file or the card itself."""
    p = _check_path(path)
    if p.suffix == ".json" and p.is_file():
        return p
    folder = p if p.is_dir() else p.parent
    candidates = [folder / n for n in CARD_NAMES]
    if p.is_file():
        candidates.insert(0, p.with_suffix(".json"))
    for c in candidates:
        if c.is_file():
            return c
    raise PolicyRefused(
        f"policy {path}: no model card (looked for {', '.join(str(c) for c in candidates)}); "
        f"{WHAT_TO_GIVE}"
    )


def read_card(path: str | Path) -> dict:
    card_path = find_card(path)
    try:
        if card_path.stat().st_size > MAX_CARD_BYTES:
            raise PolicyRefused(
                f"policy {path}: model card {card_path} is larger than "
                f"{MAX_CARD_BYTES >> 20} MiB: not a model card"
            )
        card = json.loads(card_path.read_text())
    except UnicodeDecodeError:
        raise PolicyRefused(
            f"policy {path}: model card {card_path} is not text (JSON expected)"
        ) from None
    except ValueError as exc:
        if isinstance(exc, PolicyRefused):
            raise
        raise PolicyRefused(
            f"policy {path}: model card {card_path} is not valid JSON: {exc}"
        ) from None
    except OSError as exc:
        raise PolicyRefused(
            f"policy {path}: cannot read model card {card_path}: {exc.strerror or exc}"
        ) from None
    if not isinstance(card, dict):
        raise PolicyRefused(f"policy {path}: model card {card_path} is not a JSON object")
    return card


def card_encoder_version(card: Mapping) -> int | None:
    for key in ("feature_encoder", "encoder", "features"):
        section = card.get(key)
        if isinstance(section, Mapping):
            for name in ("encoder_version", "version"):
                if isinstance(section.get(name), int):
                    return section[name]
    value = card.get("encoder_version")
    return value if isinstance(value, int) else None


def check_compatible(card: Mapping, caps: NodeCapabilities, encoder_version: int) -> list[str]:
    """Every reason the model described by ``card`` must not control a node with ``caps``."""
    problems = []
    version = card_encoder_version(card)
    if version is None:
        problems.append("the model card names no feature encoder version")
    elif version != encoder_version:
        problems.append(
            f"feature encoder version {version} (this build encodes version {encoder_version})"
        )
    sup = card.get("capabilities", card.get("supported_capabilities"))
    if sup is None:
        problems.append("the model card lists no capabilities it was trained on")
        return problems
    if not isinstance(sup, Mapping):
        problems.append("the model card's capabilities are not a mapping")
        return problems
    if sup.get("requires_cat") and caps.l3 is None:
        problems.append("the model needs cache allocation (CAT); the node has none")
    if sup.get("requires_mba") and caps.mba is None:
        problems.append("the model needs memory bandwidth allocation (MBA); the node has none")
    if caps.mba is None and sup.get("trained_without_mba") is False:
        problems.append("the model was trained only on nodes with MBA; the node has none")
    modes = sup.get("mba_modes")
    if modes is not None and caps.mba is not None and caps.mba.mode.value not in modes:
        problems.append(f"MBA mode {caps.mba.mode.value!r} not among the model's {list(modes)}")
    vendors = sup.get("vendors")
    if vendors is not None and caps.vendor.value not in vendors:
        problems.append(f"vendor {caps.vendor.value!r} not among the model's {list(vendors)}")
    if caps.l3 is not None:
        n = caps.l3.num_ways
        ways = sup.get("num_ways")
        lo, hi = sup.get("ways_min"), sup.get("ways_max")
        if isinstance(ways, Mapping):
            lo, hi = ways.get("min", lo), ways.get("max", hi)
        elif ways is not None and n not in ways:
            problems.append(f"{n} L3 ways not among the model's {list(ways)}")
        if (lo is not None and n < lo) or (hi is not None and n > hi):
            problems.append(f"{n} L3 ways outside the model's range [{lo}, {hi}]")
        most = sup.get("min_cbm_bits_max")
        if most is not None and caps.l3.min_cbm_bits > most:
            problems.append(
                f"the node needs {caps.l3.min_cbm_bits} bits per mask; the model was trained "
                f"with at most {most}"
            )
    return problems


def load_policy(path: str | Path, caps: NodeCapabilities, groups: int = 0) -> Controller:
    """The exported policy at ``path`` as a Controller, or :class:`PolicyRefused`."""
    card = read_card(path)
    try:
        from models.features import ENCODER_VERSION
    except ImportError as exc:  # pragma: no cover - models.features ships with the package
        raise PolicyRefused(f"this build has no feature encoder: {exc}") from exc
    problems = check_compatible(card, caps, ENCODER_VERSION)
    if problems:
        raise PolicyRefused(f"policy {path} refused for this node: " + "; ".join(problems))
    sup = card.get("capabilities", card.get("supported_capabilities")) or {}
    max_groups = sup.get("max_groups")
    if isinstance(max_groups, int) and groups > max_groups:
        log.warning(
            "policy %s handles %d groups; the node has %d: the rest keep their allocation",
            path,
            max_groups,
            groups,
        )
    try:
        from models.policy import PolicyController
    except ImportError as exc:
        raise PolicyRefused(
            f"policy {path}: the learned-policy runtime (models.policy) is not available: {exc}"
        ) from exc
    try:
        controller = PolicyController.load(path)
    except Exception as exc:  # a corrupt ONNX file, a missing input, ...
        raise PolicyRefused(f"policy {path}: cannot load: {exc}") from exc
    check = getattr(controller, "check_compatible", None)
    if callable(check):
        try:
            check(caps)
        except Exception as exc:
            raise PolicyRefused(f"policy {path} refused for this node: {exc}") from exc
    return controller

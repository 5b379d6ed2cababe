"""The learned-policy runtime: an exported ONNX policy behind the ``Controller`` interface.

Loads what ``rdtune export`` writes (training/export.py): ``policy.onnx`` and
``model_card.json``. Before deciding anything it checks that the policy fits: the card's
feature encoder version and layout must be this code's (:mod:`models.features`), its
action design this code's decoder (:mod:`models.actions`), and the node's capabilities
within what the policy was trained on (CAT present, ways and minimum mask bits in range,
an MBA mode it has seen). A mismatch raises
:class:`PolicyCompatibilityError` saying what differs, so a policy never sees inputs it was
not trained on (ARCHITECTURE.md, "Data flow"). Groups beyond the policy's slots are not a
refusal: the encoder leaves them out and the decoder leaves their allocation untouched
(models/features.py), which each decision's note says.

Each decision: encode the snapshot (the same encoder as training), apply the card's
observation normalisation, run the actor (ONNX Runtime, 1 intra-op thread, batch 1;
RL.md: ~33/50 us p50/p99 on this class of machine), and decode the action into a plan that
is valid by construction. Episodes in training start from CoPart's equal split, so
:meth:`PolicyController.start` applies it too. No torch here: the runtime needs numpy and
onnxruntime only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from agent.types import NodeCapabilities, Snapshot
from models.actions import ActionDecoder
from models.basic import EqualPartition
from models.controller import ControlContext, Controller, Decision
from models.features import ENCODER_VERSION, FeatureEncoder
from models.setup import ControllerError, Unavailable

log = logging.getLogger("rdtune.policy")

CARD_FORMAT = "rdtune-policy-card/1"
ACTION_DESIGN = "multidiscrete-share-levels"
DEFAULT_POLICY = Path(__file__).parent / "policies" / "default"


class PolicyError(ControllerError):
    """An exported policy that cannot be loaded (missing, corrupt, unknown format)."""


class PolicyCompatibilityError(PolicyError):
    """The policy does not fit this code or this node; the message says what differs."""


def _read_card(path: Path) -> tuple[dict[str, Any], Path]:
    if path.is_dir():
        card_path = path / "model_card.json"
    elif path.suffix == ".onnx":
        card_path = path.with_name("model_card.json")
    else:
        card_path = path
    if not card_path.exists():
        raise PolicyError(f"{card_path}: no model card (expected an 'rdtune export' directory)")
    try:
        card = json.loads(card_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PolicyError(f"{card_path}: not a readable JSON model card: {exc}") from None
    if not isinstance(card, dict) or card.get("format") != CARD_FORMAT:
        got = card.get("format") if isinstance(card, dict) else type(card).__name__
        raise PolicyError(f"{card_path}: model card format {got!r}; this code reads {CARD_FORMAT}")
    return card, card_path.parent


CARD_NAMES = ("model_card.json", "card.json")


class PolicyRefused(Unavailable):
    """The model cannot control this node (or its export cannot be read); says why."""


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


def check_export(path: str | Path, caps: NodeCapabilities, groups: int = 0) -> None:
    """Refuse (:class:`PolicyRefused`, every mismatch named) an export that cannot control a
    node with ``caps``; groups beyond the policy's slots are a warning, not a refusal."""
    card = read_card(path)
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


def policy_available() -> bool:
    """Whether the bundled policy is there (a checkout without it still evaluates)."""
    return (DEFAULT_POLICY / "model_card.json").is_file()


class PolicyController(Controller):
    """A trained policy as a controller.

    Args:
        path: the export directory (or its ``model_card.json``); default: the shipped
            ``models/policies/default``.
        threads: ONNX Runtime intra-op threads (1: a decision is tiny; more only adds
            synchronisation).
    """

    name = "policy"

    def __init__(self, path: str | Path | None = None, *, threads: int = 1) -> None:
        card, root = _read_card(Path(path) if path is not None else DEFAULT_POLICY)
        self.card = card
        self.path = root
        self._check_code(card)
        features, actions = card["features"], card["actions"]
        self.encoder = FeatureEncoder(int(features["max_groups"]))
        self.decoder = ActionDecoder(
            int(actions["max_groups"]), int(actions["share_levels"]), int(actions["mba_levels"])
        )
        self.masked = bool(card.get("masked", False))
        norm = card.get("observation_normalization")
        self._norm = None
        if norm is not None:
            mean = np.asarray(norm["mean"], dtype=np.float32)
            std = np.sqrt(np.asarray(norm["var"], dtype=np.float64) + norm["epsilon"])
            if mean.shape != (self.encoder.size,) or std.shape != (self.encoder.size,):
                raise PolicyError(f"{root}: normalisation statistics do not match the features")
            self._norm = (mean, std.astype(np.float32), float(norm["clip"]))
        self._session = self._open(root / card["onnx"]["file"], card["onnx"].get("sha256"), threads)
        self._caps: NodeCapabilities | None = None
        self._baseline = EqualPartition()

    @classmethod
    def load(cls, path: str | Path, **kwargs: Any) -> PolicyController:
        return cls(path, **kwargs)

    # ------------------------------------------------------------------ checks

    def _check_code(self, card: dict) -> None:
        version = card.get("encoder_version")
        if version != ENCODER_VERSION:
            raise PolicyCompatibilityError(
                f"{self.path}: policy trained with feature encoder v{version}; this code "
                f"encodes v{ENCODER_VERSION} (retrain or use a matching rdtune)"
            )
        want = FeatureEncoder(int(card["features"]["max_groups"])).layout()
        if card["features"].get("names") != want["names"]:
            raise PolicyCompatibilityError(
                f"{self.path}: the card's feature layout differs from encoder v{ENCODER_VERSION}'s"
            )
        design = card.get("action_design")
        if design != ACTION_DESIGN:
            raise PolicyCompatibilityError(
                f"{self.path}: action design {design!r}; this code decodes {ACTION_DESIGN!r}"
            )

    def check_capabilities(self, caps: NodeCapabilities) -> None:
        """Raise :class:`PolicyCompatibilityError` unless the node is one the policy fits."""
        need = self.card.get("capabilities", {})
        where = f"policy {self.card.get('name')!r} ({self.path})"
        if caps.l3 is None:
            if need.get("requires_cat", True):
                raise PolicyCompatibilityError(
                    f"{where} needs cache allocation (CAT / L3 QoS); the node has none"
                )
        else:
            ways = caps.l3.num_ways
            lo, hi = need.get("ways_min", 1), need.get("ways_max", 64)
            if not lo <= ways <= hi:
                raise PolicyCompatibilityError(
                    f"{where} was trained on {lo}..{hi} LLC ways; the node has {ways}"
                )
            bits = need.get("min_cbm_bits_max")
            if bits is not None and caps.l3.min_cbm_bits > bits:
                raise PolicyCompatibilityError(
                    f"{where} was trained with min_cbm_bits <= {bits}; the node needs "
                    f"{caps.l3.min_cbm_bits}"
                )
        modes = need.get("mba_modes")
        if caps.mba is not None and modes is not None and caps.mba.mode.value not in modes:
            raise PolicyCompatibilityError(
                f"{where} was trained with MBA modes {modes}; the node's is {caps.mba.mode.value}"
            )
        if caps.mba is None and not need.get("trained_without_mba", True):
            raise PolicyCompatibilityError(f"{where} was only trained on nodes with MBA")

    # ------------------------------------------------------------------ runtime

    @staticmethod
    def _open(path: Path, sha256: str | None, threads: int):
        import onnxruntime as ort

        try:
            data = path.read_bytes()
        except OSError as exc:
            raise PolicyError(f"{path}: cannot read the ONNX policy: {exc.strerror}") from None
        if sha256 and hashlib.sha256(data).hexdigest() != sha256:
            raise PolicyError(f"{path}: ONNX file does not match the card's sha256 (corrupt?)")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        try:
            return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise PolicyError(f"{path}: not a loadable ONNX model: {exc}") from None

    def act(self, obs: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """The policy's action for one encoded observation (normalised here)."""
        o = obs.astype(np.float32, copy=False)[None, :]
        if self._norm is not None:
            mean, std, clip = self._norm
            o = np.clip((o - mean) / std, -clip, clip).astype(np.float32)
        feeds = {"obs": o}
        if self.masked:
            if mask is None:
                mask = np.ones(int(self.decoder.nvec.sum()), dtype=bool)
            feeds["action_mask"] = mask[None, :]
        return self._session.run(None, feeds)[0][0]

    def start(self, ctx: ControlContext) -> Decision:
        self.check_capabilities(ctx.capabilities)
        self._caps = ctx.capabilities
        start = self._baseline.start(ctx)
        return Decision(start.plan, note=f"policy {self.card.get('name')}: equal split to start")

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        caps = ctx.capabilities
        if caps is not self._caps and caps != self._caps:
            self.check_capabilities(caps)
            self._caps = caps
        slots = self.encoder.slots(ctx.groups)
        if not slots:
            return Decision(note="policy: no own groups")
        obs = self.encoder.encode(snapshot, ctx.allocation, ctx.groups, caps, slots)
        mask = self.decoder.action_mask(len(slots), caps) if self.masked else None
        decoded = self.decoder.decode(self.act(obs, mask), slots, caps)
        note = "policy: " + ", ".join(f"{g}={decoded.ways.get(g, '-')}w" for g in slots)
        if decoded.repairs:
            note += " (" + "; ".join(decoded.repairs) + ")"
        if len(ctx.groups) > len(slots):
            note += f"; {len(ctx.groups) - len(slots)} groups beyond the policy's slots untouched"
        return Decision(decoded.plan, note=note)

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
from pathlib import Path
from typing import Any

import numpy as np

from agent.types import NodeCapabilities, Snapshot
from models.actions import ActionDecoder
from models.basic import EqualPartition
from models.controller import ControlContext, Controller, Decision
from models.features import ENCODER_VERSION, FeatureEncoder

CARD_FORMAT = "rdtune-policy-card/1"
ACTION_DESIGN = "multidiscrete-share-levels"
DEFAULT_POLICY = Path(__file__).parent / "policies" / "default"


class PolicyError(ValueError):
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

    check_compatible = check_capabilities  # the name tuner/policy.py looks for

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

"""The learned-policy runtime: an exported ONNX policy behind the ``Controller`` interface.

Loads what ``rdtune export`` writes (training/export.py): ``policy.onnx`` and its model card
(models/card.py). Before deciding anything it checks that the policy fits: the card's
feature encoder version and layout must be this code's (:mod:`models.features`), its
action design this code's decoder (:mod:`models.actions`), and the node's capabilities
within what the policy was trained on (CAT present, ways and minimum mask bits in range,
an MBA mode it has seen). A mismatch raises :class:`PolicyCompatibilityError` naming every
difference, so a policy never sees inputs it was not trained on (docs/ARCHITECTURE.md,
"Data flow"). Groups beyond the policy's slots are not a refusal: the encoder leaves them
out and the decoder leaves their allocation untouched (models/features.py), which each
decision's note says.

Each decision: encode the snapshot (the same encoder as training), apply the card's
observation normalisation, run the actor (ONNX Runtime, 1 intra-op thread, batch 1;
docs/BENCHMARKS.md has its latency), and decode the action into a plan that is valid by
construction. Episodes in training start from CoPart's equal split, so
:meth:`PolicyController.start` applies it too. No torch here: the runtime needs numpy and
onnxruntime only.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np

from agent.types import NodeCapabilities, Snapshot
from models.actions import ActionDecoder
from models.basic import EqualPartition
from models.card import CARD_FILE, ModelCard, PolicyCompatibilityError, PolicyError
from models.controller import ControlContext, Controller, Decision
from models.features import FeatureEncoder

log = logging.getLogger("rdtune.policy")

DEFAULT_POLICY = Path(__file__).parent / "policies" / "default"

__all__ = [
    "DEFAULT_POLICY",
    "PolicyCompatibilityError",
    "PolicyController",
    "PolicyError",
    "check_export",
    "policy_available",
]


def check_export(path: str | Path, caps: NodeCapabilities, groups: int = 0) -> ModelCard:
    """The export's card when it can control a node with ``caps``, else
    :class:`PolicyCompatibilityError` naming every mismatch; groups beyond the policy's
    slots are a warning, not a refusal."""
    card = ModelCard.read(path)
    problems = card.problems(caps)
    if problems:
        raise PolicyCompatibilityError("; ".join(problems))
    if groups > card.trained_on.max_groups:
        log.warning(
            "policy %s handles %d groups; the node has %d: the rest keep their allocation",
            path,
            card.trained_on.max_groups,
            groups,
        )
    return card


def policy_available() -> bool:
    """Whether the bundled policy is there (a checkout without it still evaluates)."""
    return (DEFAULT_POLICY / CARD_FILE).is_file()


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
        card = ModelCard.read(path if path is not None else DEFAULT_POLICY)
        self.card = card
        self.path = card.root
        problems = card.code_problems()
        if problems:
            raise PolicyCompatibilityError(f"{self.path}: " + "; ".join(problems))
        features, actions = card.features, card.actions
        self.encoder = FeatureEncoder(int(features["max_groups"]))
        self.decoder = ActionDecoder(
            int(actions["max_groups"]), int(actions["share_levels"]), int(actions["mba_levels"])
        )
        self.masked = card.masked
        norm = card.normalization
        self._norm = None
        if norm is not None:
            mean = np.asarray(norm["mean"], dtype=np.float32)
            std = np.sqrt(np.asarray(norm["var"], dtype=np.float64) + norm["epsilon"])
            if mean.shape != (self.encoder.size,) or std.shape != (self.encoder.size,):
                raise PolicyError(
                    f"{self.path}: normalisation statistics do not match the features"
                )
            self._norm = (mean, std.astype(np.float32), float(norm["clip"]))
        self._session = self._open(self.path / card.onnx["file"], card.onnx.get("sha256"), threads)
        self._caps: NodeCapabilities | None = None
        self._baseline = EqualPartition()

    @classmethod
    def load(cls, path: str | Path, **kwargs: Any) -> PolicyController:
        return cls(path, **kwargs)

    def check_capabilities(self, caps: NodeCapabilities) -> None:
        """Raise :class:`PolicyCompatibilityError` unless the node is one the policy fits."""
        problems = self.card.trained_on.problems(caps)
        if problems:
            raise PolicyCompatibilityError(
                f"policy {self.card.name!r} ({self.path}): " + "; ".join(problems)
            )

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
        return Decision(start.plan, note=f"policy {self.card.name}: equal split to start")

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

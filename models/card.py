"""The model card of an exported policy: one dataclass, one file, one reader and writer.

``rdtune export`` (training/export.py) writes it as ``model_card.json`` beside
``policy.onnx``; the policy runtime (models/policy.py), the tuner (through the controller
catalogue) and the results document read it with :meth:`ModelCard.read`. It follows the
usual model-card sections (Mitchell et al., "Model Cards for Model Reporting", FAT* 2019):

- ``model``: name, export time, algorithm, checkpoint;
- ``intended_use``: what the policy is for, and what is out of scope;
- ``training_data``: the environment and its settings, the machines trained on
  (:class:`TrainedOn`, what a runtime checks a node against), the training configuration
  and the command that trained it;
- ``evaluation``: held-out episodes, the policy against the heuristics, and the ONNX parity
  check;
- ``limitations``;
- ``runtime``: what a runtime must match before feeding the policy: the ONNX file and its
  checksum, the feature encoder's version and layout (models/features.py), the action
  design and its sizes (models/actions.py), the observation normalisation; and the SLO
  shield it runs behind where that differs from the training environment's (``shield``,
  models/shield.py).

Versioned by ``format``: this code writes ``rdtune-policy-card/2`` and reads version 1 too
(the flat layout of earlier exports; its missing sections are written from the same facts).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.configfile import file_kind
from agent.types import NodeCapabilities
from models.features import ENCODER_VERSIONS, FeatureEncoder
from models.setup import ControllerError, Unavailable

CARD_FILE = "model_card.json"
FORMAT = "rdtune-policy-card/2"
FORMAT_V1 = "rdtune-policy-card/1"
ACTION_DESIGN = "multidiscrete-share-levels"
MAX_CARD_BYTES = 16 << 20
WHAT_TO_GIVE = "give the export directory, its .onnx file or its model card"


class PolicyError(ControllerError):
    """An exported policy that cannot be loaded (missing, corrupt, not a model card)."""


class PolicyCompatibilityError(PolicyError, Unavailable):
    """The policy does not fit this code or this node; the message says what differs."""


# --------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class TrainedOn:
    """The machines a policy saw in training, as ranges a runtime checks a node against.

    Attributes:
        max_groups: group slots (more groups are left untouched, not refused).
        presets: the simulated machine presets trained on.
        ways_min, ways_max: the LLC way counts seen.
        min_cbm_bits_max: the largest minimum mask size seen.
        requires_cat: a node without cache allocation is refused.
        requires_mba: a node without MBA is refused.
        mba_modes: the MBA modes seen (None: not recorded).
        trained_without_mba: whether nodes without MBA were seen.
        vendors: the CPU vendors seen (None: not recorded).
    """

    max_groups: int
    presets: tuple[str, ...] = ()
    ways_min: int = 1
    ways_max: int = 64
    min_cbm_bits_max: int | None = None
    requires_cat: bool = True
    requires_mba: bool = False
    mba_modes: tuple[str, ...] | None = None
    trained_without_mba: bool = True
    vendors: tuple[str, ...] | None = None

    def problems(self, caps: NodeCapabilities) -> list[str]:
        """Every reason a node with ``caps`` is not one the policy was trained for."""
        out = []
        if caps.l3 is None:
            if self.requires_cat:
                out.append("the model needs cache allocation (CAT / L3 QoS); the node has none")
        else:
            n = caps.l3.num_ways
            if not self.ways_min <= n <= self.ways_max:
                out.append(
                    f"{n} L3 ways outside the model's range [{self.ways_min}, {self.ways_max}]"
                )
            bits = self.min_cbm_bits_max
            if bits is not None and caps.l3.min_cbm_bits > bits:
                out.append(
                    f"the node needs {caps.l3.min_cbm_bits} bits per mask (min_cbm_bits); the "
                    f"model was trained with at most {bits}"
                )
        if caps.mba is None:
            if self.requires_mba:
                out.append("the model needs memory bandwidth allocation (MBA); the node has none")
            elif not self.trained_without_mba:
                out.append("the model was trained only on nodes with MBA; the node has none")
        elif self.mba_modes is not None and caps.mba.mode.value not in self.mba_modes:
            out.append(
                f"MBA mode {caps.mba.mode.value!r} not among the model's {list(self.mba_modes)}"
            )
        if self.vendors is not None and caps.vendor.value not in self.vendors:
            out.append(f"vendor {caps.vendor.value!r} not among the model's {list(self.vendors)}")
        return out

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "max_groups": self.max_groups,
            "presets": list(self.presets),
            "ways_min": self.ways_min,
            "ways_max": self.ways_max,
            "min_cbm_bits_max": self.min_cbm_bits_max,
            "requires_cat": self.requires_cat,
            "requires_mba": self.requires_mba,
            "mba_modes": None if self.mba_modes is None else list(self.mba_modes),
            "trained_without_mba": self.trained_without_mba,
        }
        if self.vendors is not None:
            out["vendors"] = list(self.vendors)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> TrainedOn:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise PolicyError(f"{where}: unknown trained-on keys {sorted(unknown)}")
        if not isinstance(data.get("max_groups"), int):
            raise PolicyError(f"{where}: the trained-on section names no max_groups")
        values = dict(data)
        for key in ("presets", "mba_modes", "vendors"):
            if values.get(key) is not None:
                values[key] = tuple(values[key])
        return cls(**values)


def standard_sections(
    trained_on: TrainedOn, env: Mapping[str, Any]
) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(intended use, out of scope, limitations) of a policy trained on ``trained_on`` in
    the environment ``env`` (``{id, kwargs}``): what every rdtune export states."""
    kwargs = env.get("kwargs") or {}
    interval = kwargs.get("interval_s")
    cadence = f"one decision every {interval:g} s" if interval else "one decision per interval"
    modes = ", ".join(trained_on.mba_modes or ()) or "none recorded"
    machines = ", ".join(trained_on.presets) or "the simulator's presets"
    use = (
        f"Splitting last-level cache ways and memory bandwidth among up to "
        f"{trained_on.max_groups} resctrl groups of latency-critical services and batch jobs, "
        f"{cadence}, on machines like those it was trained on ({machines}: "
        f"{trained_on.ways_min}-{trained_on.ways_max} ways, MBA modes {modes}), run by "
        f"'rdtune tune --controller policy:PATH' behind the tuner's SLO guard, or compared "
        f"with the heuristics by 'rdtune eval'."
    )
    out_of_scope = (
        "Nodes outside the trained capabilities: the runtime refuses them.",
        f"More than {trained_on.max_groups} groups: the extra groups keep their allocation.",
        "Running without the SLO guard and its fallback: the policy's SLO term is a penalty "
        "in its reward, not a guarantee.",
        "Deciding at another cadence than it was trained at (use the decide_s option).",
    )
    limitations = (
        "Trained and evaluated on the simulated node only (agent/sim); what it learned is "
        "bounded by the simulator's fidelity (docs/SIMULATOR.md).",
        f"Training mixes come from {env.get('id', 'the environment')}'s scenario source "
        f"{kwargs.get('scenarios', 'random')!r}; workloads, loads or phases unlike them are "
        "outside what it saw.",
        "The evaluation table compares mean episode returns on held-out simulated mixes; "
        "claims that one controller beats another need rdtune eval's paired comparisons.",
    )
    return use, out_of_scope, limitations


# --------------------------------------------------------------------------- the card


@dataclass(frozen=True)
class ModelCard:
    """An exported policy's model card (see the module docstring for the sections).

    ``root`` is the directory the card was read from (where ``onnx["file"]`` is)."""

    name: str
    created: str
    algorithm: str
    checkpoint: str
    intended_use: str
    out_of_scope: tuple[str, ...]
    env: Mapping[str, Any]
    trained_on: TrainedOn
    training_config: Mapping[str, Any]
    evaluation: Mapping[str, Any] | None
    limitations: tuple[str, ...]
    onnx: Mapping[str, Any]
    encoder_version: int
    features: Mapping[str, Any]
    actions: Mapping[str, Any]
    masked: bool
    normalization: Mapping[str, Any] | None = None
    parity: Mapping[str, Any] | None = None
    command: str | None = None  # the command line that trained it
    # the SLO shield's options where the policy runs (None: the training env's shield)
    shield: Mapping[str, Any] | None = None
    format: str = FORMAT
    root: Path | None = field(default=None, compare=False)

    # ------------------------------------------------------------------ checks

    def code_problems(self) -> list[str]:
        """Every reason this code cannot serve the policy (encoder, layout, actions)."""
        out = []
        v = self.encoder_version
        if v not in ENCODER_VERSIONS:
            out.append(
                f"feature encoder version {v} (this build encodes versions "
                f"{', '.join(map(str, ENCODER_VERSIONS))}; retrain or use a matching rdtune)"
            )
        else:
            want = FeatureEncoder(int(self.features["max_groups"]), v).layout()
            if self.features.get("names") != want["names"]:
                out.append(f"the card's feature layout differs from encoder v{v}'s")
        kind = self.actions.get("kind")
        if kind != ACTION_DESIGN:
            out.append(f"action design {kind!r}; this code decodes {ACTION_DESIGN!r}")
        return out

    def problems(self, caps: NodeCapabilities) -> list[str]:
        """Every reason the policy must not control a node with ``caps`` here."""
        return self.code_problems() + self.trained_on.problems(caps)

    # ------------------------------------------------------------------ file

    def as_dict(self) -> dict[str, Any]:
        evaluation = dict(self.evaluation) if self.evaluation is not None else None
        if self.parity is not None:
            evaluation = {**(evaluation or {}), "parity": dict(self.parity)}
        return {
            "format": FORMAT,
            "model": {
                "name": self.name,
                "created": self.created,
                "algorithm": self.algorithm,
                "checkpoint": self.checkpoint,
            },
            "intended_use": {"summary": self.intended_use, "out_of_scope": list(self.out_of_scope)},
            "training_data": {
                "env": dict(self.env),
                "trained_on": self.trained_on.as_dict(),
                "config": dict(self.training_config),
                "command": self.command,
            },
            "evaluation": evaluation,
            "limitations": list(self.limitations),
            "runtime": {
                "onnx": dict(self.onnx),
                "encoder_version": self.encoder_version,
                "features": dict(self.features),
                "actions": dict(self.actions),
                "masked": self.masked,
                "observation_normalization": self.normalization,
            }
            | ({"shield": dict(self.shield)} if self.shield is not None else {}),
        }

    def runtime_shield(self) -> Any:
        """The shield the policy runs behind: the runtime's, else the training env's."""
        if self.shield is not None:
            return dict(self.shield)
        return ((self.env or {}).get("kwargs") or {}).get("shield", False)

    def write(self, directory: str | Path) -> Path:
        """Write ``directory/model_card.json``; its path."""
        path = Path(directory) / CARD_FILE
        path.write_text(json.dumps(self.as_dict(), indent=2, default=str) + "\n")
        return path

    @classmethod
    def read(cls, path: str | Path) -> ModelCard:
        """The card of an export given as its directory, its .onnx file or the card; any
        problem is a :class:`PolicyError` saying what ``path`` is instead."""
        card_path = find_card(path)
        data = _load_json(card_path, path)
        return cls.from_dict(data, where=str(card_path), root=card_path.parent)

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, where: str = "model card", root: Path | None = None
    ) -> ModelCard:
        fmt = data.get("format")
        if fmt == FORMAT_V1:
            data = _upgrade_v1(data)
        elif fmt != FORMAT:
            raise PolicyError(
                f"{where}: model card format {fmt!r}; this code reads {FORMAT} and {FORMAT_V1}"
            )
        try:
            model, use, train = data["model"], data["intended_use"], data["training_data"]
            runtime = data["runtime"]
            evaluation = dict(data["evaluation"]) if data.get("evaluation") else None
            parity = evaluation.pop("parity", None) if evaluation is not None else None
            return cls(
                name=str(model["name"]),
                created=str(model["created"]),
                algorithm=str(model["algorithm"]),
                checkpoint=str(model["checkpoint"]),
                intended_use=str(use["summary"]),
                out_of_scope=tuple(use["out_of_scope"]),
                env=dict(train["env"]),
                trained_on=TrainedOn.from_dict(train["trained_on"], where),
                training_config=dict(train.get("config") or {}),
                evaluation=evaluation,
                limitations=tuple(data["limitations"]),
                onnx=dict(runtime["onnx"]),
                encoder_version=_int(runtime["encoder_version"], "encoder_version", where),
                features=dict(runtime["features"]),
                actions=dict(runtime["actions"]),
                masked=bool(runtime["masked"]),
                normalization=runtime.get("observation_normalization"),
                parity=parity,
                command=train.get("command"),
                shield=_shield(runtime.get("shield"), where),
                root=root,
            )
        except KeyError as exc:
            raise PolicyError(f"{where}: the model card has no {exc.args[0]!r}") from None
        except (TypeError, AttributeError) as exc:
            raise PolicyError(f"{where}: a malformed model card: {exc}") from None


def _shield(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise PolicyError(f"{where}: runtime.shield is not a mapping of shield options: {value!r}")
    return dict(value)


def _int(value: Any, key: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise PolicyError(f"{where}: {key} is not an integer: {value!r}")
    return value


def _upgrade_v1(data: Mapping[str, Any]) -> dict[str, Any]:
    """A version-1 card (one flat object) in version 2's sections; what version 1 did not
    say (intended use, limitations) is written from the same facts."""
    missing = [k for k in ("name", "onnx", "features", "actions", "capabilities") if k not in data]
    if missing:
        raise KeyError(missing[0])
    caps = data["capabilities"]
    trained_on = TrainedOn.from_dict(caps, "model card v1")
    env = dict(data.get("env") or {})
    use, out_of_scope, limitations = standard_sections(trained_on, env)
    actions = dict(data["actions"])
    actions.setdefault("kind", data.get("action_design"))
    evaluation = dict(data["evaluation"]) if data.get("evaluation") else None
    if data.get("parity") is not None:
        evaluation = {**(evaluation or {}), "parity": data["parity"]}
    return {
        "format": FORMAT,
        "model": {k: data.get(k, "") for k in ("name", "created", "algorithm", "checkpoint")},
        "intended_use": {"summary": use, "out_of_scope": list(out_of_scope)},
        "training_data": {
            "env": env,
            "trained_on": caps,
            "config": data.get("training") or {},
        },
        "evaluation": evaluation,
        "limitations": list(limitations),
        "runtime": {
            "onnx": data["onnx"],
            "encoder_version": data.get("encoder_version"),
            "features": data["features"],
            "actions": actions,
            "masked": data.get("masked", False),
            "observation_normalization": data.get("observation_normalization"),
        },
    }


# --------------------------------------------------------------------------- finding it


def _check_path(path: str | Path) -> Path:
    """``path`` when it names a directory or a regular file we may read; else
    :class:`PolicyError` saying what it is instead (a device, a broken link, ...)."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        if p.is_symlink():
            raise PolicyError(
                f"policy {path}: a broken symbolic link (to {os.readlink(p)}); {WHAT_TO_GIVE}"
            ) from None
        raise PolicyError(f"policy {path}: no such file or directory") from None
    except PermissionError:
        raise PolicyError(f"policy {path}: permission denied") from None
    except OSError as exc:
        raise PolicyError(f"policy {path}: cannot access: {exc.strerror}") from None
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        raise PolicyError(f"policy {path}: {file_kind(st.st_mode)}, not a policy; {WHAT_TO_GIVE}")
    if not os.access(p, os.R_OK | (os.X_OK if stat.S_ISDIR(st.st_mode) else 0)):
        raise PolicyError(f"policy {path}: permission denied")
    return p


def find_card(path: str | Path) -> Path:
    """The card of an export given as its directory, its .onnx file or the card itself."""
    p = _check_path(path)
    if p.is_dir():
        card = p / CARD_FILE
    elif p.suffix == ".onnx":
        card = p.with_name(CARD_FILE)
    elif p.suffix == ".json":
        return p
    else:
        raise PolicyError(
            f"policy {path}: no model card (not a .json or .onnx file); {WHAT_TO_GIVE}"
        )
    if not card.is_file():
        raise PolicyError(f"policy {path}: no model card ({card}); {WHAT_TO_GIVE}")
    return card


def _load_json(card_path: Path, given: str | Path) -> Mapping[str, Any]:
    try:
        if card_path.stat().st_size > MAX_CARD_BYTES:
            raise PolicyError(
                f"policy {given}: model card {card_path} is larger than "
                f"{MAX_CARD_BYTES >> 20} MiB: not a model card"
            )
        data = json.loads(card_path.read_text())
    except UnicodeDecodeError:
        raise PolicyError(f"policy {given}: model card {card_path} is not text (JSON)") from None
    except json.JSONDecodeError as exc:
        raise PolicyError(
            f"policy {given}: model card {card_path} is not valid JSON: {exc}"
        ) from None
    except OSError as exc:
        raise PolicyError(
            f"policy {given}: cannot read model card {card_path}: {exc.strerror or exc}"
        ) from None
    if not isinstance(data, dict):
        raise PolicyError(f"policy {given}: model card {card_path} is not a JSON object")
    return data


__all__ = [
    "ACTION_DESIGN",
    "CARD_FILE",
    "FORMAT",
    "FORMAT_V1",
    "ModelCard",
    "PolicyCompatibilityError",
    "PolicyError",
    "TrainedOn",
    "find_card",
    "standard_sections",
]

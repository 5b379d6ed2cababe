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

import hashlib
import json
import math
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.configfile import ConfigError, file_kind, read_regular
from agent.types import NodeCapabilities
from models.features import ENCODER_VERSIONS, MAX_GROUP_SLOTS, FeatureEncoder, refused_on
from models.setup import ControllerError, Unavailable
from models.shield import ShieldConfig

CARD_FILE = "model_card.json"
FORMAT = "rdtune-policy-card/2"
FORMAT_V1 = "rdtune-policy-card/1"
ACTION_DESIGN = "multidiscrete-share-levels"
MAX_CARD_BYTES = 16 << 20
MAX_ONNX_BYTES = 1 << 30
# Generous bounds on a card's sizes (the slots' is the encoder's), so a hand-edited card is
# refused before it makes the runtime build a layout or an action table of gigabytes (a
# policy's levels are tens).
MAX_LEVELS = 1024
BASELINES = ("current", "equal", "full")
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
    def of_nodes(
        cls, names: Sequence[str], caps: Sequence[NodeCapabilities], max_groups: int
    ) -> TrainedOn:
        """The machines of a run on recorded traces or on an agent's node (``names``, e.g.
        the trace files, each with its node's ``caps``), as the ranges a runtime checks:
        their ways, mask sizes, MBA modes and vendors, and no more (the simulator's
        presets are not what such a policy saw)."""
        l3 = [c.l3 for c in caps if c.l3 is not None]
        return cls(
            max_groups=max_groups,
            presets=tuple(names),
            ways_min=min((c.num_ways for c in l3), default=1),
            ways_max=max((c.num_ways for c in l3), default=1),
            min_cbm_bits_max=max((c.min_cbm_bits for c in l3), default=None),
            requires_cat=len(l3) == len(caps),
            mba_modes=tuple(sorted({c.mba.mode.value for c in caps if c.mba is not None})),
            trained_without_mba=any(c.mba is None for c in caps),
            vendors=tuple(sorted({c.vendor.value for c in caps})),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> TrainedOn:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise PolicyError(f"{where}: unknown trained-on keys {sorted(unknown)}")
        if not isinstance(data.get("max_groups"), int):
            raise PolicyError(f"{where}: the trained-on section names no max_groups")
        at = "training_data.trained_on."
        values = dict(data)
        values["max_groups"] = _int(
            data["max_groups"], at + "max_groups", where, 1, MAX_GROUP_SLOTS
        )
        for key in ("ways_min", "ways_max", "min_cbm_bits_max"):
            if key in data and not (key == "min_cbm_bits_max" and data[key] is None):
                values[key] = _int(data[key], at + key, where, 0, 1 << 16)
        for key in ("requires_cat", "requires_mba", "trained_without_mba"):
            if key in data:
                values[key] = _bool(data[key], at + key, where)
        if "presets" in data:
            values["presets"] = _strings(data["presets"], at + "presets", where)
        for key in ("mba_modes", "vendors"):  # None: not recorded
            if data.get(key) is not None:
                values[key] = _strings(data[key], at + key, where)
        return cls(**values)


def trained_interval_s(env: Mapping[str, Any]) -> float | None:
    """The decision interval a policy trained in ``env`` (a card's ``{id, kwargs, ...}``)
    learned at: the one the run recorded (``interval_s``), else its env kwargs'; None when
    neither says (a card from before the run recorded it, its env at its default)."""
    for value in (env.get("interval_s"), (env.get("kwargs") or {}).get("interval_s")):
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
    return None


def standard_sections(
    trained_on: TrainedOn, env: Mapping[str, Any]
) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(intended use, out of scope, limitations) of a policy trained on ``trained_on`` in
    the environment ``env`` (``{id, kwargs}``): what every rdtune export states."""
    kwargs = env.get("kwargs") or {}
    interval = trained_interval_s(env)
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
    paired = "claims that one controller beats another need rdtune eval's paired comparisons."
    env_id = str(env.get("id", ""))
    if env_id.endswith("TracePartition-v0"):
        recorded = ", ".join(f"{t:g} s" for t in env.get("trace_interval_s") or ())
        limitations: tuple[str, ...] = (
            f"Trained on recorded traces ({machines}"
            + (f"; recorded every {recorded}" if recorded else "")
            + "), replayed: they do not answer its actions as a node would, so what it "
            "learned is bounded by the allocations and loads the traces hold "
            "(docs/TRACES.md).",
            "Its checkpoints were chosen, and its evaluation table made, by replaying the "
            f"training traces (traces have no held-out split); {paired}",
        )
    elif env_id.endswith("RemotePartition-v0"):
        scenario = kwargs.get("scenario")
        limitations = (
            f"Trained on one node, {machines}"
            + (f", running scenario {scenario!r}" if scenario else "")
            + ": workloads, loads or machines unlike it are outside what it saw.",
            f"Its evaluation table was made on an agent's node, not on held-out mixes; {paired}",
        )
    else:
        limitations = (
            "Trained and evaluated on the simulated node only (agent/sim); what it learned "
            "is bounded by the simulator's fidelity (docs/SIMULATOR.md).",
            f"Training mixes come from {env_id or 'the environment'}'s scenario source "
            f"{kwargs.get('scenarios', 'random')!r}; workloads, loads or phases unlike them "
            "are outside what it saw.",
            f"The evaluation table compares mean episode returns on held-out simulated mixes; "
            f"{paired}",
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
            encoder = FeatureEncoder(int(self.features["max_groups"]), v)
            if self.features.get("names") != encoder.layout()["names"]:
                out.append(f"the card's feature layout differs from encoder v{v}'s")
            norm = self.normalization
            if norm is not None and len(norm["mean"]) != encoder.size:
                out.append(
                    f"the observation normalisation has {len(norm['mean'])} values, the "
                    f"features {encoder.size}"
                )
        slots = {
            "training_data.trained_on": self.trained_on.max_groups,
            "runtime.features": self.features["max_groups"],
            "runtime.actions": self.actions["max_groups"],
        }
        if len(set(slots.values())) > 1:  # one policy, one number of slots (a card edited)
            out.append(
                "the card's group slots differ: "
                + ", ".join(f"{k}.max_groups {v}" for k, v in slots.items())
            )
        kind = self.actions.get("kind")
        if kind != ACTION_DESIGN:
            out.append(f"action design {kind!r}; this code decodes {ACTION_DESIGN!r}")
        try:
            ShieldConfig.of(self.runtime_shield())
        except (TypeError, ValueError) as exc:
            out.append(f"the shield it runs behind: {exc}")
        return out

    def problems(self, caps: NodeCapabilities) -> list[str]:
        """Every reason the policy must not control a node with ``caps`` here."""
        return self.code_problems() + self.node_problems(caps)

    def node_problems(self, caps: NodeCapabilities) -> list[str]:
        """Every reason a node with ``caps`` is not one the policy can control: outside what
        it was trained on, or one where its features' meaning has changed since."""
        out = self.trained_on.problems(caps)
        if self.encoder_version in ENCODER_VERSIONS:
            why = refused_on(self.encoder_version, caps)
            out += [why] if why else []
        return out

    def servable(self) -> bytes:
        """The ONNX file's bytes when this code can serve the policy (what can be checked
        without a node); else PolicyCompatibilityError or PolicyError naming the file."""
        problems = self.code_problems()
        if problems:
            raise PolicyCompatibilityError(f"{self.root}: " + "; ".join(problems))
        data = self.read_onnx()
        _check_onnx(self.onnx_path, data)
        return data

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
        """The shield the policy runs behind: the training env's, with the runtime's
        options (the card's runtime section) over its own. The runtime changes what it
        names and keeps the rest of the shield the policy learned behind."""
        trained = ((self.env or {}).get("kwargs") or {}).get("shield", False)
        if self.shield is None:
            return trained
        # a training env without a shield: a card from before the config refused that
        base = trained if isinstance(trained, dict) else {}
        return {**base, **self.shield}

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
            model = _section(data, "model", where)
            use = _section(data, "intended_use", where)
            train = _section(data, "training_data", where)
            runtime = _section(data, "runtime", where)
            evaluation = _optional_section(data, "evaluation", where)
            parity = evaluation.pop("parity", None) if evaluation is not None else None
            version = _int(runtime["encoder_version"], "encoder_version", where)
            return cls(
                name=str(model["name"]),
                created=str(model["created"]),
                algorithm=str(model["algorithm"]),
                checkpoint=str(model["checkpoint"]),
                intended_use=str(use["summary"]),
                out_of_scope=_strings(use["out_of_scope"], "intended_use.out_of_scope", where),
                env=_env(_section(train, "env", where, "training_data."), where),
                trained_on=TrainedOn.from_dict(
                    _section(train, "trained_on", where, "training_data."), where
                ),
                training_config=_optional_section(train, "config", where, "training_data.") or {},
                evaluation=evaluation,
                limitations=_strings(data["limitations"], "limitations", where),
                onnx=_onnx(_section(runtime, "onnx", where, "runtime."), where),
                encoder_version=version,
                features=_features(
                    _section(runtime, "features", where, "runtime."), where, version
                ),
                actions=_actions(_section(runtime, "actions", where, "runtime."), where),
                masked=_bool(runtime["masked"], "runtime.masked", where),
                normalization=_normalization(runtime.get("observation_normalization"), where),
                parity=parity,
                command=_text(train.get("command"), "training_data.command", where),
                shield=_shield(runtime.get("shield"), where),
                root=root,
            )
        except KeyError as exc:
            raise PolicyError(f"{where}: the model card has no {exc.args[0]!r}") from None
        except (TypeError, AttributeError) as exc:
            raise PolicyError(f"{where}: a malformed model card: {exc}") from None

    # ------------------------------------------------------------------ its ONNX file

    @property
    def onnx_path(self) -> Path:
        """Where the policy's ONNX file is: beside the card (``runtime.onnx.file``)."""
        return (self.root or Path(".")) / self.onnx["file"]

    def read_onnx(self) -> bytes:
        """The ONNX file's bytes, checked against the card's sha256; PolicyError naming the
        file when it is missing, not a regular file (a pipe would block the reader), too
        large or not the file the card was written for."""
        path = self.onnx_path
        try:
            data = read_regular(path, MAX_ONNX_BYTES, "a policy")
        except ConfigError as exc:  # the card's runtime.onnx.file is no file we may read
            raise PolicyError(f"cannot read the ONNX policy: {exc}") from None
        sha256 = self.onnx.get("sha256")
        if sha256 and hashlib.sha256(data).hexdigest() != sha256:
            raise PolicyError(f"{path}: ONNX file does not match the card's sha256 (corrupt?)")
        return data


def _check_onnx(path: Path, data: bytes) -> None:
    """PolicyError unless ``data`` parses as an ONNX model with a graph (a file without
    the card's checksum may be anything); unchecked without the onnx package, where ONNX
    Runtime says why when the policy loads."""
    try:
        import onnx
    except ImportError:
        return
    try:
        model = onnx.load_from_string(data)
    except Exception as exc:  # protobuf's and onnx's own errors
        raise PolicyError(f"{path}: not an ONNX model ({type(exc).__name__})") from None
    if not model.graph.node:
        raise PolicyError(f"{path}: not an ONNX model (no graph)")


# --------------------------------------------------------------------------- its fields
# Each check takes the value, its key as the card spells it and the card's path, and
# returns the value as the runtime uses it, or raises PolicyError saying what is wrong.


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _section(data: Mapping[str, Any], key: str, where: str, at: str = "") -> dict[str, Any]:
    if key not in data:
        raise KeyError(at + key)
    value = data[key]
    if not isinstance(value, Mapping):
        raise PolicyError(f"{where}: {at}{key} is not a mapping: {_shown(value)}")
    return dict(value)


def _optional_section(
    data: Mapping[str, Any], key: str, where: str, at: str = ""
) -> dict[str, Any] | None:
    return None if data.get(key) is None else _section(data, key, where, at)


def _int(value: Any, key: str, where: str, lo: int | None = None, hi: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise PolicyError(f"{where}: {key} is not an integer: {_shown(value)}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise PolicyError(f"{where}: {key} is {value}, outside [{lo}, {hi}]")
    return value


def _bool(value: Any, key: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(f"{where}: {key} is not true or false: {_shown(value)}")
    return value


def _text(value: Any, key: str, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise PolicyError(f"{where}: {key} is not a string: {_shown(value)}")
    return value


def _strings(value: Any, key: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"{where}: {key} is not a list of strings: {_shown(value)}")
    return tuple(value)


def _env(env: dict[str, Any], where: str) -> dict[str, Any]:
    kwargs = _optional_section(env, "kwargs", where, "training_data.env.")
    if kwargs is not None:
        baseline = kwargs.get("baseline", "equal")
        if baseline not in BASELINES:
            raise PolicyError(
                f"{where}: training_data.env.kwargs.baseline is {_shown(baseline)}; one of "
                f"{', '.join(BASELINES)}"
            )
        env["kwargs"] = kwargs
    return env


def _onnx(onnx: dict[str, Any], where: str) -> dict[str, Any]:
    name = onnx.get("file")
    at = "runtime.onnx."
    # the card and its model travel together: the file is one beside the card
    if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
        raise PolicyError(f"{where}: {at}file must name a file beside the card, got {_shown(name)}")
    sha256 = onnx.get("sha256")
    if sha256 is not None and not (
        isinstance(sha256, str) and len(sha256) == 64 and set(sha256) <= set("0123456789abcdef")
    ):
        raise PolicyError(f"{where}: {at}sha256 is not a sha256 hex digest: {_shown(sha256)}")
    inputs = _optional_section(onnx, "inputs", where, at)
    for key, dims in (inputs or {}).items():
        if not isinstance(dims, list) or not all(
            isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool)) for d in dims
        ):
            raise PolicyError(
                f"{where}: {at}inputs.{key} is not a list of dimensions: {_shown(dims)}"
            )
    return onnx


def _features(features: dict[str, Any], where: str, version: int) -> dict[str, Any]:
    _int(features.get("max_groups"), "runtime.features.max_groups", where, 1, MAX_GROUP_SLOTS)
    # the encoder is built from runtime.encoder_version: another version here means a card
    # edited or written by hand, whose features the policy was not trained on
    if "encoder_version" in features and features["encoder_version"] != version:
        raise PolicyError(
            f"{where}: runtime.features.encoder_version {_shown(features['encoder_version'])} "
            f"is not runtime.encoder_version {version}"
        )
    if "names" in features:
        _strings(features["names"], "runtime.features.names", where)
    return features


def _actions(actions: dict[str, Any], where: str) -> dict[str, Any]:
    at = "runtime.actions."
    _int(actions.get("max_groups"), at + "max_groups", where, 1, MAX_GROUP_SLOTS)
    for key in ("share_levels", "mba_levels"):
        _int(actions.get(key), at + key, where, 1, MAX_LEVELS)
    if "share_all" in actions:
        _bool(actions["share_all"], at + "share_all", where)
    return actions


def _normalization(norm: Any, where: str) -> dict[str, Any] | None:
    """The observation normalisation's statistics, finite, with variances >= 0."""
    if norm is None:
        return None
    at = "runtime.observation_normalization"
    if not isinstance(norm, Mapping):
        raise PolicyError(f"{where}: {at} is not a mapping: {_shown(norm)}")
    out = dict(norm)
    for key in ("mean", "var"):
        values = norm.get(key)
        if not isinstance(values, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            for v in values
        ):
            raise PolicyError(f"{where}: {at}.{key} is not a list of finite numbers")
    if len(norm["mean"]) != len(norm["var"]):
        raise PolicyError(f"{where}: {at}: mean and var differ in length")
    if any(v < 0 for v in norm["var"]):
        raise PolicyError(f"{where}: {at}.var holds a negative variance")
    for key in ("epsilon", "clip"):
        value = norm.get(key)
        if not (
            isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf
        ):
            raise PolicyError(f"{where}: {at}.{key} is not a positive number: {_shown(value)}")
    return out


def _shield(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise PolicyError(f"{where}: runtime.shield is not a mapping of shield options: {value!r}")
    return dict(value)


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

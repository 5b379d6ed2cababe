"""The controller catalogue: every controller rdtune can build, registered once.

An :class:`Entry` names a controller, its factory (whose keyword parameters are the
controller's options), what it needs from the node beyond the Node contract (e.g. ground
truth, agent/node.py), whether it makes its own groups, and its ``prepare`` hook, which
calibrates it for the node it will drive (models/prepare.py). The tuner (``rdtune tune
--controller``), evaluation (``rdtune eval``, ``rdtune demo``), training's held-out
comparison and ``rdtune trace record`` all build controllers here, so they know the same
names and set each controller up the same way; a node that lacks what a controller needs
gets it refused with the reason (:class:`~models.setup.Unavailable`).

A controller is named by a spec string: ``NAME`` or ``NAME[key=value,...]`` (values are YAML
scalars, e.g. ``ubik[slack=0.01]``, ``static[ways=4]``), ``policy:PATH`` for an exported
policy (``policy[path=PATH]``), or ``import:MODULE:CLASS`` for an operator's own
:class:`~models.controller.Controller`. Any controller takes ``decide_s``: it then decides
every ``decide_s`` seconds from the merged snapshots of those intervals
(:class:`~models.cadence.Every`), e.g. ``policy[decide_s=1]`` at the one-second cadence the
bundled policy was trained at.
"""

from __future__ import annotations

import importlib
import inspect
import math
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from agent.configfile import parse_problem
from agent.types import GroupKind, GroupSpec
from models import prepare
from models.basic import EqualPartition, Unpartitioned
from models.cadence import Every
from models.coco import CoCo, RoundRobin
from models.controller import Controller
from models.copart import CoPart
from models.copart.variants import CoPartCatOnly, CoPartMbaOnly
from models.explore import Explore
from models.oracle import Oracle
from models.policy import PolicyController, RandomController
from models.setup import ControllerError, Need, Setup, Unavailable
from models.static import BestStatic, StaticController
from models.ubik import StaticLC, Ubik
from models.ucp import UcpStyle

Options = dict[str, Any]

# Options every controller takes beside its own: the catalogue handles them (build).
COMMON_OPTIONS = frozenset({"decide_s"})


@dataclass(frozen=True)
class Entry:
    """One controller of the catalogue.

    Attributes:
        name: what specs and ``--controller`` call it.
        factory: constructs it from its options (keyword arguments).
        summary: one line for listings.
        needs: what it needs from the node beyond the Node contract; a node without it
            is refused.
        prepare: ``(setup, options) -> options``: calibration for the node (may refuse).
        prepare_options: options ``prepare`` takes for itself, beside the factory's (a
            calibration's settings); it does not pass them to the factory.
        filled: factory parameters ``prepare`` supplies from the node (not options).
        calibrated: options ``prepare`` measures when they are not given, by a sweep on
            a copy of the node (or on the node itself where allowed: ``rdtune tune
            --calibrate``).
        derived: what ``prepare`` takes from the node, without a sweep, for options not
            given (free text for listings; empty: nothing).
        own_groups: it makes its own groups: the node must start without per-workload ones.
        exclusive: the kinds of group whose ways it keeps apart from every other group's
            (None: every kind). A node with an exclusive group of another kind is refused:
            its plans would share that group's ways, which the kernel refuses.
    """

    name: str
    factory: Callable[..., Controller]
    summary: str
    needs: frozenset[Need] = frozenset()
    prepare: Callable[[Setup, Options], Options] | None = None
    prepare_options: tuple[str, ...] = ()
    filled: tuple[str, ...] = ()
    calibrated: tuple[str, ...] = ()
    derived: str = ""
    own_groups: bool = False
    exclusive: frozenset[GroupKind] | None = None

    def options(self) -> dict[str, Any]:
        """Option name -> default (``inspect.Parameter.empty`` when required)."""
        params = inspect.signature(self.factory).parameters.values()
        return {
            p.name: p.default
            for p in params
            if p.name not in self.filled and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        }

    def takes(self) -> frozenset[str] | None:
        """Every option name a spec may give it: the factory's, ``prepare``'s own and
        :data:`COMMON_OPTIONS`; None when the factory takes any keyword (``**kwargs``)."""
        params = inspect.signature(self.factory).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return None
        return frozenset(self.options()) | frozenset(self.prepare_options) | COMMON_OPTIONS


# What prepare takes from a node without a sweep (Entry.derived), as listings say it.
COPART_STREAM = "stream: STREAM profiled on a simulated node, else estimated from peak bandwidth"
TIME_SHARING_SERVICES = "services, groups, background_pids: a simulated node's workloads, or given"


def _entries(*entries: Entry) -> dict[str, Entry]:
    return {e.name: e for e in entries}


CATALOGUE: Mapping[str, Entry] = _entries(
    Entry(
        "unpartitioned",
        Unpartitioned,
        "every group may use every way at full bandwidth",
        exclusive=frozenset(),
    ),
    Entry("eq", EqualPartition, "ways and memory bandwidth split equally (CoPart's EQ)"),
    Entry("explore", Explore, "random valid allocations held a few intervals (trace recording)"),
    Entry(
        "static",
        StaticController,
        "catbench: the first LC group at the knee of an offline way sweep, the rest share",
        prepare=prepare.prepare_static,
        prepare_options=prepare.STATIC_SWEEP_OPTIONS,
        calibrated=("lc_group", "ways"),
        exclusive=frozenset({GroupKind.LC}),
    ),
    Entry(
        "best_static",
        BestStatic,
        "CoPart's ST: the best single allocation by exhaustive search (a reference)",
        prepare=prepare.prepare_best_static,
        calibrated=("result",),
        exclusive=frozenset(),
    ),
    Entry(
        "oracle",
        Oracle,
        "the safe oracle: the best allocation keeping every SLO, on the simulator's truth",
        needs=frozenset({Need.GROUND_TRUTH}),
        prepare=prepare.prepare_oracle,
        filled=("node",),
        exclusive=frozenset(),
    ),
    Entry(
        "copart",
        CoPart,
        "CoPart: LLC ways and memory bandwidth traded for fairness among batch jobs",
        prepare=prepare.prepare_copart,
        derived=COPART_STREAM,
        exclusive=frozenset({GroupKind.LC}),
    ),
    Entry(
        "copart_cat",
        CoPartCatOnly,
        "CoPart's CAT-only variant: LLC ways traded, bandwidth at the equal split",
        prepare=prepare.prepare_copart,
        derived=COPART_STREAM,
        exclusive=frozenset({GroupKind.LC}),
    ),
    Entry(
        "copart_mba",
        CoPartMbaOnly,
        "CoPart's MBA-only variant: memory bandwidth only, ways at the equal split",
        prepare=prepare.prepare_copart_mba,
        derived=COPART_STREAM,
        exclusive=frozenset({GroupKind.LC}),
    ),
    Entry(
        "ubik",
        Ubik,
        "Ubik: LC groups sized by a slack controller around profiled targets, batch by UCP",
        prepare=prepare.prepare_ubik,
        calibrated=("profiles",),
        exclusive=frozenset(),  # LC and batch regions may meet
    ),
    Entry(
        "static_lc",
        StaticLC,
        "Ubik's StaticLC: each LC group always at its profiled target, batch by UCP",
        prepare=prepare.prepare_ubik,
        calibrated=("profiles",),
        exclusive=frozenset(),  # LC and batch regions may meet
    ),
    Entry("ucp", UcpStyle, "UCP: every group sized by Lookahead on its online miss curve"),
    Entry(
        "coco",
        CoCo,
        "CoCo: LC services time-share tiers of ways, sized by a sensitivity profile",
        prepare=prepare.prepare_coco,
        calibrated=("profile",),
        derived=TIME_SHARING_SERVICES,
        own_groups=True,
    ),
    Entry(
        "round_robin",
        RoundRobin,
        "LC services take turns in CoCo's tiers (no profile)",
        prepare=prepare.prepare_round_robin,
        derived=TIME_SHARING_SERVICES,
        own_groups=True,
    ),
    Entry(
        "random",
        RandomController,
        "random share and MBA levels each interval, behind the SLO shield (shield=false: bare)",
    ),
    Entry(
        "policy",
        PolicyController,
        "a learned policy exported by 'rdtune export' (default: the bundled one)",
        prepare=prepare.prepare_policy,
    ),
)


def names() -> list[str]:
    return list(CATALOGUE)


def get(name: str) -> Entry:
    try:
        return CATALOGUE[name]
    except KeyError:
        raise ControllerError(
            f"unknown controller {name!r}; choose from {', '.join(CATALOGUE)}, "
            f"policy:PATH or import:MODULE:CLASS"
        ) from None


def _imported(target: str) -> Entry:
    module, _, attr = target.removeprefix("import:").partition(":")
    if not module or not attr:
        raise ControllerError(f"{target!r}: use import:MODULE:CLASS")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ControllerError(f"{target!r}: {exc}") from exc
    if not callable(factory):
        raise ControllerError(
            f"{target!r}: {module}.{attr} is a {type(factory).__name__}, not a controller class"
        )
    try:
        inspect.signature(factory)  # what option checks read; some builtins have none
    except (TypeError, ValueError) as exc:
        raise ControllerError(f"{target!r}: not a controller class ({exc})") from exc
    return Entry(target, factory, "an operator's own controller")


# ----------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class ControllerSpec:
    """A controller name with options; ``label`` is how tables name it."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""
    text: str = ""  # the spec string (parses back to this spec)

    def __post_init__(self) -> None:
        if not self.text:
            opts = ",".join(f"{k}={v}" for k, v in self.options.items())
            object.__setattr__(self, "text", f"{self.name}[{opts}]" if opts else self.name)
        if not self.label:
            object.__setattr__(self, "label", self.text)
        # every controller's option, refused as the spec is made: before anything runs
        if self.options.get("decide_s") is not None:
            try:
                decide_s_of(self.options["decide_s"])
            except ControllerError as exc:
                raise ControllerError(f"controller {self.label!r}: {exc}") from None

    @property
    def entry(self) -> Entry:
        return _imported(self.name) if self.name.startswith("import:") else get(self.name)

    @classmethod
    def parse(cls, text: str) -> ControllerSpec:
        text = text.strip()
        if text.startswith("policy:"):
            path = text.removeprefix("policy:")
            if not path:
                raise ControllerError("policy: needs a path (policy:/path/to/export)")
            return cls("policy", {"path": path}, text, text)
        name, bracket, rest = text.partition("[")
        name = name.strip()
        if not name or (bracket and not rest.endswith("]")):
            raise ControllerError(
                f"bad controller spec {text!r}; expected NAME or NAME[key=value,...]"
            )
        options: dict[str, Any] = {}
        for item in filter(None, (p.strip() for p in rest[:-1].split(","))):
            key, eq, value = (part.strip() for part in item.partition("="))
            if not eq or not key:
                raise ControllerError(f"bad option {item!r} in controller spec {text!r}")
            try:
                options[key] = yaml.safe_load(value)
            except yaml.YAMLError as exc:
                raise ControllerError(
                    f"bad value for option {key!r} in {text!r}: {parse_problem(exc)}"
                ) from None
        if not name.startswith("import:"):
            check_option_types(get(name), options, text)
        return cls(name, options, text, text)

    def with_options(self, options: Mapping[str, Any]) -> ControllerSpec:
        """This spec with ``options`` added (the spec's own win: they are more specific)."""
        if not options:
            return self
        return ControllerSpec(self.name, {**options, **self.options}, self.label, self.text)


def split_specs(text: str) -> list[ControllerSpec]:
    """``"eq,ubik[slack=0.01],copart"`` -> specs (commas inside brackets stay)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [ControllerSpec.parse(s) for s in out if s.strip()]


# Annotations the option check understands; any other leaves the option to the constructor.
_SIMPLE_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "str": (str,),
    "None": (type(None),),
}
_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


def check_option_names(spec: ControllerSpec) -> None:
    """Refuse the options ``spec`` gives that its controller takes under no name (a
    calibrating controller's include its calibration's, :meth:`Entry.takes`), naming them
    and the ones it takes: what the tuner and rdtune eval check before any node is there."""
    takes = spec.entry.takes()
    unknown = sorted(set(spec.options) - takes) if takes is not None else []
    if unknown:
        raise ControllerError(
            f"controller {spec.label!r}: unknown option(s) {', '.join(unknown)}; "
            f"it takes {', '.join(sorted(takes))}"
        )


def check_specs(texts: Iterable[str]) -> None:
    """:func:`check_spec` for each of the controller specs ``texts`` (each text once)."""
    for text in dict.fromkeys(texts):
        check_spec(text)


def check_spec(spec: ControllerSpec | str) -> None:
    """Refuse before any run what every run of the controller ``spec`` names would fail
    on: option names it does not take (``eq[foo=1]``), and, loading a policy export as its
    runs will (:func:`construct`: models/policy.py's loader), an unusable one (no such
    path, a training run's directory, a corrupt or non-finite ONNX file, a bad card, a
    card whose inputs are not its graph's), in the loader's one line. rdtune eval, the
    demo, the tuner and a training config's evaluation controllers check with it."""
    spec = _spec(spec)
    check_option_names(spec)  # a ControllerError: a ValueError, said in one line
    if spec.name != "policy":
        return
    try:
        construct(spec)  # its errors name the controller (a ControllerError from the cause)
    except ValueError as exc:  # ControllerError and PolicyError among them
        text = " ".join(str(exc).split())
        if isinstance(exc, ControllerError) and text == str(exc):
            raise
        raise ControllerError(text) from exc


def check_option_types(entry: Entry, options: Mapping[str, Any], label: str) -> None:
    """Refuse an option whose value the constructor's annotation rules out, naming it: a
    string where a number belongs otherwise fails deep inside with a Python type error."""
    try:
        params = inspect.signature(entry.factory).parameters
    except (TypeError, ValueError):  # a builtin or an odd callable: the call will say
        return
    for key, value in options.items():
        param = params.get(key)
        annotation = param.annotation if param is not None else None
        if not isinstance(annotation, str):
            continue  # postponed annotations are strings; a missing one checks nothing
        words = [w.strip() for w in annotation.split("|")]
        if not all(w in _SIMPLE_TYPES for w in words):
            continue
        allowed = tuple(t for w in words for t in _SIMPLE_TYPES[w])
        # bool is an int to Python, not to an operator writing seed=true
        if isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed):
            continue
        want = " or ".join(_TYPE_WORDS.get(w, "none") for w in words)
        raise ControllerError(
            f"controller {label!r}: option {key!r} must be {want}, "
            f"got {value!r} ({type(value).__name__})"
        )


def _spec(spec: ControllerSpec | str) -> ControllerSpec:
    return ControllerSpec.parse(spec) if isinstance(spec, str) else spec


# ----------------------------------------------------------------------------- building


def build(spec: ControllerSpec | str, setup: Setup) -> Controller:
    """The controller ``spec`` names, prepared for ``setup``'s node as it is now.

    Raises :class:`~models.setup.Unavailable` naming what the node lacks, or
    :class:`~models.setup.ControllerError` for an unknown name or bad options."""
    spec = _spec(spec)
    entry = spec.entry
    options = dict(spec.options)
    decide_s = options.pop("decide_s", None)
    check_option_types(entry, options, spec.label)
    try:
        _check_exclusive(entry, setup)
        for need in sorted(entry.needs, key=lambda n: n.name):
            if not need.offered_by(setup.node):
                raise Unavailable(
                    f"it needs {need.value}, which this {type(setup.node).__name__} does not offer"
                )
        if entry.prepare is not None:
            options = entry.prepare(setup, options)
    except Unavailable as exc:
        raise Unavailable(f"controller {spec.label!r} cannot run on this node: {exc}") from None
    except ControllerError as exc:
        raise ControllerError(f"controller {spec.label!r}: {exc}") from None
    return _cadence(_construct(entry, options, spec.label), decide_s, setup.interval_s)


def _check_exclusive(entry: Entry, setup: Setup) -> None:
    """:class:`Unavailable` when the node has an exclusive group of a kind ``entry`` does
    not keep apart (its first plan would be refused, mid-run)."""
    problem = shares_exclusive(entry.name, setup.node.groups())
    if problem:
        raise Unavailable(problem)


def shares_exclusive(name: str, groups: Mapping[str, GroupSpec]) -> str | None:
    """Why the controller ``name`` cannot serve a node with ``groups``: an exclusive group
    of a kind it lets share ways (the kernel refuses such plans); None when it can, or
    when the name is not the catalogue's."""
    entry = CATALOGUE.get(name)
    if entry is None or entry.exclusive is None:
        return None
    shared = sorted(g for g, s in groups.items() if s.exclusive and s.kind not in entry.exclusive)
    if not shared:
        return None
    kept = " and ".join(sorted(k.value.upper() for k in entry.exclusive))
    shares = f"groups other than {kept} ones share ways" if kept else "groups share ways"
    return (
        f"group(s) {', '.join(shared)} are exclusive, and under it {shares}; eq, ucp and "
        "the policy keep every group's ways apart"
    )


def construct(spec: ControllerSpec | str, interval_s: float = 0.1) -> Controller:
    """The controller ``spec`` names from its options alone, without a node: nothing is
    calibrated (the SLO guard's fallback is built before the tuner connects)."""
    spec = _spec(spec)
    options = dict(spec.options)
    decide_s = options.pop("decide_s", None)
    entry = spec.entry
    if entry.needs:
        raise Unavailable(f"controller {spec.label!r} needs a node to be built for")
    check_option_types(entry, options, spec.label)
    return _cadence(_construct(entry, options, spec.label), decide_s, interval_s)


def _construct(entry: Entry, options: Options, label: str) -> Controller:
    try:
        inspect.signature(entry.factory).bind(**options)
    except TypeError as exc:
        raise ControllerError(f"bad options for controller {label!r}: {exc}") from None
    except ValueError:  # a builtin without a signature: let the call say
        pass
    try:
        controller = entry.factory(**options)
    except (TypeError, ValueError) as exc:  # options out of range, a corrupt export, ...
        raise ControllerError(f"controller {label!r}: {exc}") from exc
    if not isinstance(controller, Controller):
        raise ControllerError(f"{label} is not a models.controller.Controller")
    return controller


def decide_s_of(decide_s: Any) -> float:
    """The ``decide_s`` option's seconds: a finite number > 0, else a ControllerError."""
    try:
        seconds = float(decide_s)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ControllerError(f"decide_s must be a number of seconds > 0, got {decide_s!r}")
    return seconds


def _cadence(controller: Controller, decide_s: Any, interval_s: float) -> Controller:
    if decide_s is None:
        return controller
    seconds = decide_s_of(decide_s)
    k = round(seconds / interval_s)
    if k < 1 or abs(k * interval_s - seconds) > 1e-6:
        raise ControllerError(
            f"decide_s={decide_s} must be a whole number of {interval_s:g} s intervals"
        )
    return Every(controller, k) if k > 1 else controller


# ----------------------------------------------------------------------------- listing


def describe() -> str:
    """Every controller: name, summary, options (defaults) and needs; what ``rdtune tune
    --list-controllers`` and ``rdtune eval --list-controllers`` print."""
    indent = " " * 15
    lines = []
    for entry in CATALOGUE.values():
        lines.append(f"{entry.name:14s} {entry.summary}")
        opts = ", ".join(
            k if v is inspect.Parameter.empty else f"{k}={v!r}" for k, v in entry.options().items()
        )
        notes = [f"options: {opts or '-'}"]
        if entry.prepare_options:
            notes.append(f"calibration options: {', '.join(entry.prepare_options)}")
        if entry.calibrated:
            notes.append(
                f"calibrated by a sweep of the node when not given: {', '.join(entry.calibrated)}"
            )
        if entry.derived:
            notes.append(f"taken from the node when not given: {entry.derived}")
        notes += [f"needs {n.value}" for n in sorted(entry.needs, key=lambda n: n.name)]
        if entry.own_groups:
            notes.append("makes its own groups")
        for note in notes:
            lines += textwrap.wrap(
                note, 100, initial_indent=indent, subsequent_indent=indent + "  "
            )
    return "\n".join(lines)

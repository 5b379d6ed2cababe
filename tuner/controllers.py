"""Which controller the tuner runs, and which one the SLO guard falls back to.

``--controller`` accepts a name from ``models.registry`` (the heuristics), ``policy:PATH``
(an exported learned policy, see tuner/policy.py) or ``import:MODULE:CLASS`` (an operator's
own :class:`~models.controller.Controller` subclass, constructed with the configured
options). The fallback defaults to the static allocation, else Ubik in strict mode, else
the equal partition -- whichever of them the registry has (issue 8, "SLO guard").
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping

from agent.types import NodeCapabilities
from models import registry
from models.controller import Controller

FALLBACK_ORDER = ("static", "ubik", "eq")


class ControllerError(ValueError):
    """A controller that cannot be built (unknown name, bad options); says why."""


def _construct(factory, options: Mapping, what: str) -> Controller:
    try:
        controller = factory(**options)
    except TypeError as exc:
        raise ControllerError(f"{what}: bad options {dict(options)}: {exc}") from exc
    if not isinstance(controller, Controller):
        raise ControllerError(f"{what} is not a models.controller.Controller")
    return controller


def build(
    spec: str, caps: NodeCapabilities, options: Mapping | None = None, groups: int = 0
) -> Controller:
    """The controller ``spec`` names, for a node with ``caps``."""
    options = dict(options or {})
    if spec == "policy":  # the registry's entry: the policy shipped in models/policies/default
        from models.policy import DEFAULT_POLICY

        spec = f"policy:{options.pop('path', DEFAULT_POLICY)}"
    if spec.startswith("policy:"):
        from tuner.policy import load_policy

        path = spec.removeprefix("policy:")
        if not path:
            raise ControllerError("policy: needs a path (policy:/path/to/export)")
        return load_policy(path, caps, groups)
    if spec.startswith("import:"):
        module, _, attr = spec.removeprefix("import:").partition(":")
        if not module or not attr:
            raise ControllerError(f"{spec!r}: use import:MODULE:CLASS")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ControllerError(f"{spec!r}: {exc}") from exc
        return _construct(factory, options, spec)
    try:
        factory = registry.factory(spec)
    except ValueError as exc:
        raise ControllerError(f"{exc}, policy:PATH or import:MODULE:CLASS") from None
    return _construct(factory, options, f"controller {spec!r}")


def fallback(name: str | None = None, options: Mapping | None = None) -> Controller:
    """The SLO guard's fallback: ``name`` (with ``options``), or else the first of static /
    Ubik strict (slack 0) / eq that the registry has and that can be built without options
    (the static allocation needs its LC group and way count from an offline sweep:
    configure it as ``fallback: static`` with ``fallback_options: {lc_group, ways}``)."""
    if name:
        if name.startswith("policy:"):
            raise ControllerError("the fallback must be a heuristic, not a learned policy")
        return build(name, caps=None, options=options)  # type: ignore[arg-type]
    skipped = []
    for candidate in FALLBACK_ORDER:
        if candidate not in registry.names():
            continue
        factory = registry.factory(candidate)
        kwargs = {"slack": 0.0} if candidate == "ubik" and "slack" in _parameters(factory) else {}
        try:
            return factory(**kwargs)
        except TypeError as exc:  # needs options only the operator can give
            skipped.append(f"{candidate}: {exc}")
    raise ControllerError(
        f"no fallback controller could be built from {FALLBACK_ORDER}: {'; '.join(skipped)}"
    )


def _parameters(factory) -> set[str]:
    try:
        return set(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return set()

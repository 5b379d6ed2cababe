"""Which controller the tuner runs, and which one the SLO guard falls back to.

``--controller`` takes a spec of the controller catalogue (models/catalogue.py): a name
(``rdtune tune --list-controllers``), ``NAME[key=value,...]``, ``policy:PATH`` (an exported
learned policy) or ``import:MODULE:CLASS`` (an operator's own
:class:`~models.controller.Controller`); ``controller_options`` from the configuration add
options. The controller is built for the node once the tuner has connected, through the
same catalogue evaluation uses; a controller that calibrates (static, Ubik, CoCo,
best_static) does so on the live node only with ``--calibrate``, and is otherwise refused
with the options that make calibrating unnecessary. The fallback defaults to the static
allocation, else Ubik in strict mode, else the equal partition -- the first that can be
built from options alone (docs/DEPLOY.md, "What the safety guard guarantees").
"""

from __future__ import annotations

from collections.abc import Mapping

from agent.node import Node
from models import catalogue
from models.catalogue import ControllerSpec
from models.controller import Controller
from models.setup import ControllerError, Setup

FALLBACK_ORDER = ("static", "ubik", "eq")
FALLBACK_DEFAULTS = {"ubik": {"slack": 0.0}}  # strict Ubik: no tail degradation allowed

__all__ = ["FALLBACK_ORDER", "ControllerError", "build", "check", "fallback", "fallbacks"]


def check(spec: str, options: Mapping | None = None) -> None:
    """Refuse what can be refused of ``spec`` (with ``options``) without the node, before
    the tuner waits for its agent: the spec's syntax, the name, option names (a calibrating
    controller's include its calibration's, :meth:`~models.catalogue.Entry.takes`), and an
    exported policy, loaded as it will be (its card, its ONNX graph and the inputs the card
    records for it). The rest (what the node offers, calibration) is checked by
    :func:`build`."""
    catalogue.check_spec(ControllerSpec.parse(spec).with_options(options or {}))


def build(
    spec: str,
    node: Node,
    options: Mapping | None = None,
    *,
    interval_s: float = 0.1,
    calibrate: bool = False,
) -> Controller:
    """The controller ``spec`` names, with ``options``, for ``node`` as it is now;
    ``calibrate`` lets it calibrate on the node itself."""
    parsed = ControllerSpec.parse(spec).with_options(options or {})
    setup = Setup(node, interval_s=interval_s, live_calibration=calibrate)
    return catalogue.build(parsed, setup)


def fallback(name: str | None = None, options: Mapping | None = None) -> Controller:
    """The SLO guard's fallback: ``name`` (with ``options``), or else the first of
    :func:`fallbacks`."""
    return fallbacks(name, options)[0]


def fallbacks(name: str | None = None, options: Mapping | None = None) -> list[Controller]:
    """The SLO guard's fallback candidates, the first the node accepts to be used (the
    tuner tries them at start, :func:`tuner.switching.rehearse`): ``name`` (with
    ``options``) alone, or else those of static / Ubik strict (slack 0) / eq that can be
    built from options alone (the static allocation needs its LC group and way count from
    an offline sweep: configure it as ``fallback: static`` with ``fallback_options:
    {lc_group, ways}``); eq, last, serves any node with cache allocation."""
    if name:
        spec = ControllerSpec.parse(name)
        if spec.name == "policy":
            raise ControllerError("the fallback must be a heuristic, not a learned policy")
        return [catalogue.construct(spec.with_options(options or {}))]
    built, skipped = [], []
    for candidate in FALLBACK_ORDER:
        try:
            built.append(
                catalogue.construct(ControllerSpec(candidate, FALLBACK_DEFAULTS.get(candidate, {})))
            )
        except ControllerError as exc:  # needs options only the operator can give
            skipped.append(str(exc))
    if not built:
        raise ControllerError(
            f"no fallback controller could be built from {FALLBACK_ORDER}: {'; '.join(skipped)}"
        )
    return built

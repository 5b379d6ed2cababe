"""Each controller's ``prepare`` hook: set it up for a node the way its design deploys it.

A hook takes the :class:`~models.setup.Setup` and the options given, and returns the
options the controller is constructed with, filling in what calibration measures. Options
given skip the calibration they replace, so an operator can run a sweep once and configure
its result. Calibration runs where :meth:`Setup.calibration` allows (a copy of the node,
else the node itself only when permitted), so ``rdtune eval``, training's comparison and
``rdtune tune`` calibrate each controller the same way (docs/CONTROLLERS.md):

- ``static`` (catbench): the offline way sweep (2 s windows after 0.3 s warm-up) for the
  first LC group by name; with no LC group every group shares the cache. The sweep's
  settings (:func:`models.static.calibrate`'s keywords, e.g. ``measure_s``) are options too.
- ``ubik`` / ``static_lc``: target sizes from Ubik's profile sweep (10 intervals and at
  least 1000 requests per way count: a third of the module's default, which keeps suites
  of many runs affordable).
- ``copart`` and its variants: STREAM's profile on the node's machine when the node has a
  machine model (ground truth); otherwise CoPart's documented estimate from peak bandwidth.
- ``best_static``: its search, by ground truth when the node offers it, else by measurement.
- ``oracle``: bound to the node's ground truth.
- ``coco`` / ``round_robin``: the LC services (given as options, or listed by a node that
  offers ground truth, which must then have no per-workload groups), their tier groups
  (created), and CoCo's sensitivity profile.
- ``policy``: the export's model card checked against the node (models/policy.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from models import coco, static, ubik
from models.copart import stream_profile_sim
from models.policy import DEFAULT_POLICY, check_export
from models.setup import ControllerError, Setup, Unavailable

Options = dict[str, Any]

# catbench's sweep as evaluation runs it: a 2 s window per way count after 0.3 s of warm-up
STATIC_SWEEP = {"measure_s": 2.0, "warmup_s": 0.3}
# Ubik's profile sweep: a third of the module's default, which keeps suites affordable
UBIK_PROFILE = {"measure_intervals": 10, "min_requests": 1000}


def _call(fn: Callable[..., Any], what: str, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, with options it does not take reported as bad options."""
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as exc:
        raise ControllerError(f"bad options for {what}: {exc}") from None
    return fn(*args, **kwargs)


def keyword_options(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The keyword-only parameters of ``fn``: the options a hook passes on to it."""
    params = inspect.signature(fn).parameters.values()
    return tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY)


# The static sweep's settings (static.calibrate's keywords): options of the static
# controller's prepare step, not of the controller itself (the catalogue declares them).
STATIC_SWEEP_OPTIONS = keyword_options(static.calibrate)


def prepare_copart(setup: Setup, options: Options) -> Options:
    if "stream" not in options and setup.truth is not None:
        options["stream"] = stream_profile_sim(setup.node)
    return options


def prepare_copart_mba(setup: Setup, options: Options) -> Options:
    if setup.capabilities.mba is None:  # it trades nothing: EQ's ways under another name
        raise Unavailable("it trades memory bandwidth, and this node has no MBA")
    return prepare_copart(setup, options)


def prepare_static(setup: Setup, options: Options) -> Options:
    lcs = setup.lc_groups()
    lc = options.pop("lc_group", lcs[0] if lcs else None)
    # The sweep's settings are the prepare step's: a sweep that does not run leaves them
    # unused, so configured ways (or no LC group) do not make them unknown options.
    settings = {k: options.pop(k) for k in STATIC_SWEEP_OPTIONS if k in options}
    if lc is None:
        return {"lc_group": None, **options}  # no mite to protect: everyone shares the cache
    apart = sorted(g for g, s in setup.node.groups().items() if s.exclusive and g != lc)
    if apart:  # every group but the mite shares the rest of the cache
        raise Unavailable(
            f"group(s) {', '.join(apart)} are exclusive, and it keeps only its LC group "
            f"{lc!r}'s ways apart (give lc_group one of them, or use eq, ucp or the policy)"
        )
    if "ways" in options:
        try:  # the plan it would hold, checked now: ways beyond the node failed at start
            static.mite_plan(lc, options["ways"], list(setup.node.groups()), setup.capabilities)
        except (TypeError, ValueError) as exc:
            raise ControllerError(f"option 'ways': {exc}") from None
        return {"lc_group": lc, **options}
    sweep_options = {**STATIC_SWEEP, **settings, **options}
    checked = inspect.signature(static.check_sweep).parameters
    sweep = inspect.signature(static.calibrate).parameters  # the defaults a sweep takes
    given = {k: sweep_options.get(k, sweep[k].default) for k in checked}
    try:
        static.check_sweep(**given)
    except (TypeError, ValueError) as exc:
        raise ControllerError(f"the static sweep: {exc}") from None
    with setup.calibration("lc_group and ways") as (node, clock):
        sweep = _call(static.calibrate, "the static sweep", node, clock, lc, **sweep_options)
    return {"lc_group": sweep.lc_group, "ways": sweep.ways}


def prepare_ubik(setup: Setup, options: Options) -> Options:
    if "profiles" not in options and setup.lc_groups():
        with setup.calibration("profiles") as (node, clock):
            options["profiles"] = ubik.calibrate(node, clock, **UBIK_PROFILE)
    return options


def prepare_best_static(setup: Setup, options: Options) -> Options:
    if options.get("result") is None:
        try:
            search = _call(static.BestStatic, "best_static", **options)
        except ValueError as exc:  # an option out of range (a ControllerError passes)
            if isinstance(exc, ControllerError):
                raise
            raise ControllerError(str(exc)) from None
        if setup.truth is not None:  # scored by ground truth: the node is only read
            options["result"] = search.fit(setup.node, setup.clock, interval_s=setup.interval_s)
        else:
            with setup.calibration("result") as (node, clock):
                options["result"] = search.fit(node, clock, interval_s=setup.interval_s)
    return options


def prepare_oracle(setup: Setup, options: Options) -> Options:
    return {"node": setup.node, **options}


def prepare_time_sharing(setup: Setup, options: Options, *, profile: bool) -> Options:
    """CoCo (``profile``) and round robin: services, tier groups, CoCo's profile."""
    if "services" in options:  # an operator's config: services as plain data
        try:
            services = coco.services_from_options(options["services"])
        except ValueError as exc:
            raise ControllerError(f"option 'services': {exc}") from None
        if "groups" not in options:
            options["groups"] = coco.prepare_groups(setup.node, services[0].slo)
    else:
        truth = setup.truth
        if truth is None:
            raise Unavailable(
                "it schedules the node's LC services, which this node does not list (only a "
                "node offering ground truth does): give services=[{name, pids, slo}] and "
                "groups=[...] in its options"
            )
        if setup.node.groups():
            raise Unavailable(
                "it makes its own groups: it needs a node without per-workload groups "
                "(auto_groups=False)"
            )
        views = truth.workloads()
        services = [
            coco.Service(w.name, frozenset(w.pids), w.slo)
            for w in views
            if w.kind == "lc" and w.slo is not None
        ]
        if not services:
            raise Unavailable("it needs LC services in the scenario")
        options["background_pids"] = [p for w in views if w.kind != "lc" for p in w.pids]
        options["groups"] = coco.prepare_groups(setup.node, services[0].slo)
    options["services"] = services
    options.setdefault("slice_s", 1.0)
    if profile and "profile" not in options:
        with setup.calibration("profile") as (node, clock):
            options["profile"] = coco.calibrate(
                node,
                clock,
                services,
                options["groups"],
                background_pids=options.get("background_pids", ()),
            )
    return options


def prepare_coco(setup: Setup, options: Options) -> Options:
    return prepare_time_sharing(setup, options, profile=True)


def prepare_round_robin(setup: Setup, options: Options) -> Options:
    return prepare_time_sharing(setup, options, profile=False)


def prepare_policy(setup: Setup, options: Options) -> Options:
    path = options.get("path") or DEFAULT_POLICY
    check_export(path, setup.capabilities, len(setup.node.groups()))
    return {**options, "path": path}

"""Build a controller for a node and scenario, the way each is meant to be deployed.

Evaluation names a controller with a spec string, ``NAME`` or ``NAME[key=value,...]``
(e.g. ``ubik[slack=0.01]``, ``static[ways=4]``); values are YAML scalars. The spec string
is also the label shown in tables. Set-up follows each controller's design
(shared/design/BASELINES.md):

- ``unpartitioned``, ``eq``, ``explore``: the registry's defaults.
- ``copart``: with its STREAM profile of the node's machine (a fresh simulated node of the
  same preset; on a remote node the estimate from peak bandwidth). ``copart_cat`` /
  ``copart_mba`` are CoPart's single-resource variants from its evaluation (EuroSys'19
  section 6.1, "CAT-only"/"MBA-only"): CoPart with MBA hidden (every group at full
  bandwidth, only the LLC classifier runs), and CoPart with the LLC classifier ignored
  (ways stay at the equal split, only bandwidth moves).
- ``best_static`` (CoPart's ST) and ``oracle``: search on the simulator's ground truth.
- ``static`` (catbench): its offline way sweep on a *fresh copy* of the node (a simulated
  node deep-copies; a remote node is swept itself, then reset), for the first LC group;
  ``static[ways=k]`` skips the sweep (the suite's ways sweep).
- ``ubik[slack=s]`` and ``static_lc``: target sizes from Ubik's profile sweep on a copy
  (10 intervals and at least 1000 requests per way count: a third of the module's default,
  which keeps suites of many runs affordable; pass ``profiles`` to skip the sweep).
- ``ucp``: :class:`UcpStyle`, every group (LC included) by UCP Lookahead on online miss
  curves — the utility-only partitioning Ubik's evaluation compares against.
- ``coco`` / ``round_robin``: the node's LC services time-share CoCo's tiers; they need a
  node without per-workload groups (:func:`needs_bare_node`); CoCo's sensitivity profile
  is measured on a copy.
- ``policy[path=...]``: an exported policy (default: the bundled ``models/policies/default``).

Any controller takes ``decide_s``: it then decides every ``decide_s`` seconds from the
merged snapshots of those intervals (:class:`Every`), e.g. ``policy[decide_s=1]`` at the
one-second cadence the bundled policy was trained at.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from agent.node import Clock, Node
from agent.types import GroupKind, Snapshot
from models.allocation import equal_ways, pack_ways, plan_from
from models.controller import KEEP, ControlContext, Controller, Decision
from models.copart import ANY, LLC, MBA, CoPart
from models.ucp import MissCurve, lookahead

TIME_SHARING = ("coco", "round_robin")


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

    @classmethod
    def parse(cls, text: str) -> ControllerSpec:
        text = text.strip()
        name, _, rest = text.partition("[")
        name = name.strip()
        if not name or (rest and not rest.endswith("]")):
            raise ValueError(f"bad controller spec {text!r}; expected NAME or NAME[key=value,...]")
        options: dict[str, Any] = {}
        for item in filter(None, (p.strip() for p in rest[:-1].split(","))):
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise ValueError(f"bad option {item!r} in controller spec {text!r}")
            options[key.strip()] = yaml.safe_load(value.strip())
        if name not in BUILDERS:
            raise ValueError(f"unknown controller {name!r}; choose from {', '.join(BUILDERS)}")
        return cls(name, options, text, text)


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


def needs_bare_node(spec: ControllerSpec) -> bool:
    """True when the controller makes its own groups (the node must not auto-create them)."""
    return spec.name in TIME_SHARING


# ------------------------------------------------------------------------------ variants


class CoPartCatOnly(CoPart):
    """CoPart's CAT-only variant: it is shown a node without MBA, so only the LLC
    classifier runs and every group keeps full bandwidth."""

    name = "copart_cat"

    def start(self, ctx: ControlContext) -> Decision:
        caps = dataclasses.replace(ctx.capabilities, mba=None)
        return super().start(dataclasses.replace(ctx, capabilities=caps))


class CoPartMbaOnly(CoPart):
    """CoPart's MBA-only variant: the LLC classifier's verdicts are ignored, so ways stay
    at the equal split and only memory bandwidth is traded."""

    name = "copart_mba"

    def _producer_type(self, app):
        kind = super()._producer_type(app)
        return MBA if kind in (ANY, MBA) else None

    def _consumer_type(self, app):
        kind = super()._consumer_type(app)
        return MBA if kind in (ANY, MBA) else None

    def _can_give(self, app, rtype: str) -> bool:
        # no way moves at all: not by matching, random neighbours or undoing
        return rtype != LLC and super()._can_give(app, rtype)


class UcpStyle(Controller):
    """Utility-based cache partitioning (Qureshi & Patt, MICRO'06) as a whole-node policy:
    every group, LC or batch, gets ways by Lookahead on its online miss curve (misses/s =
    MPKI x instructions/s), recomputed every ``period`` intervals; no notion of SLOs, which
    is why Ubik's evaluation shows it hurting LC tails. MBA stays at full bandwidth. The
    interval right after a resize is a transient and not learned from."""

    name = "ucp"

    def __init__(self, period: int = 10) -> None:
        if period < 1:
            raise ValueError("period must be at least 1")
        self.period = period

    def start(self, ctx: ControlContext) -> Decision:
        caps = ctx.capabilities
        if caps.l3 is None:
            raise ValueError("UCP needs L3 cache allocation")
        self._groups = tuple(ctx.groups)
        self._curves = {g: MissCurve(caps.l3.num_ways) for g in self._groups}
        self._ips = dict.fromkeys(self._groups, 0.0)
        self._ways = equal_ways(self._groups, caps) if self._groups else {}
        self._changed = True
        self._tick = 0
        return Decision(self._plan(caps), note="ucp: equal start") if self._groups else KEEP

    def _plan(self, caps):
        masks = pack_ways(self._ways, caps)
        top = caps.mba.max_bandwidth if caps.mba else None
        return plan_from(masks, dict.fromkeys(masks, top), caps)

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        if tuple(ctx.groups) != self._groups:
            return self.start(ctx)
        if not self._groups:
            return KEEP
        for g in self._groups:
            s = snapshot.groups.get(g)
            if s is None or not s.instructions or s.llc_misses is None:
                continue
            self._ips[g] = s.instructions / max(snapshot.interval_s, 1e-9)
            if not self._changed:
                self._curves[g].observe(self._ways[g], 1000.0 * s.llc_misses / s.instructions)
        self._changed = False
        self._tick += 1
        if self._tick % self.period:
            return KEEP
        caps = ctx.capabilities
        curves = {
            g: [m * self._ips[g] / 1000.0 for m in self._curves[g].table()] for g in self._groups
        }
        ways = lookahead(curves, caps.l3.num_ways, max(1, caps.l3.min_cbm_bits))
        if ways == self._ways:
            return KEEP
        self._ways = ways
        self._changed = True
        return Decision(self._plan(caps), note=f"ucp: {ways}")


class Every(Controller):
    """Runs ``inner`` at a slower cadence: it decides every ``k``-th interval from the
    interval's snapshots merged into one (counters summed, occupancy the latest, latency
    percentiles request-weighted means — an approximation; counts exact), and the
    allocation is kept in between. So a policy trained at one decision a second runs at its
    own cadence on a node observed every 0.1 s (spec option ``decide_s``)."""

    def __init__(self, inner: Controller, k: int) -> None:
        if k < 1:
            raise ValueError("decide_s must be at least one interval")
        self.inner, self.k = inner, int(k)
        self.name = inner.name
        self.needs_tasks = inner.needs_tasks
        self._pending: list[Snapshot] = []

    def start(self, ctx: ControlContext) -> Decision:
        self._pending = []
        return self.inner.start(ctx)

    def decide(self, snapshot: Snapshot, ctx: ControlContext) -> Decision:
        self._pending.append(snapshot)
        if len(self._pending) < self.k:
            return KEEP
        merged, self._pending = merge_snapshots(self._pending), []
        return self.inner.decide(merged, ctx)


def _sum(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else float(sum(values))  # type: ignore[arg-type]


def merge_snapshots(snaps: list[Snapshot]) -> Snapshot:
    """Consecutive snapshots as one interval (see :class:`Every`)."""
    from agent.types import GroupSample, LatencyStats

    groups: dict[str, GroupSample] = {}
    for g in snaps[-1].groups:
        samples = [s.groups[g] for s in snaps if g in s.groups]
        lat = [x.latency for x in samples if x.latency is not None and x.latency.count]
        latency = samples[-1].latency
        if lat:
            n = sum(x.count for x in lat)
            latency = LatencyStats(
                n,
                *(
                    sum(getattr(x, f) * x.count for x in lat) / n
                    for f in ("p50_ms", "p95_ms", "p99_ms", "p999_ms")
                ),
            )
        groups[g] = GroupSample(
            instructions=_sum([x.instructions for x in samples]),
            cycles=_sum([x.cycles for x in samples]),
            llc_references=_sum([x.llc_references for x in samples]),
            llc_misses=_sum([x.llc_misses for x in samples]),
            llc_occupancy_bytes=samples[-1].llc_occupancy_bytes,
            memory_bytes=_sum([x.memory_bytes for x in samples]),
            memory_local_bytes=_sum([x.memory_local_bytes for x in samples]),
            latency=latency,
        )
    return dataclasses.replace(
        snaps[-1],
        interval_s=sum(s.interval_s for s in snaps),
        groups=groups,
        vanished=frozenset().union(*(s.vanished for s in snaps)),
    )


# ------------------------------------------------------------------------------ builders


def _sim(node: Node):
    from agent.sim import SimNode

    return node if isinstance(node, SimNode) else None


def _twin(node: Node, clock: Clock | None) -> tuple[Node, Clock | None, bool]:
    """Where to calibrate: a deep copy of a simulated node (the run's node is untouched),
    else the node itself (the caller resets it afterwards)."""
    sim = _sim(node)
    if sim is not None:
        twin = copy.deepcopy(sim)
        return twin, twin, True
    return node, clock, False


def _lc_groups(node: Node) -> list[str]:
    return sorted(g for g, s in node.groups().items() if s.kind is GroupKind.LC)


def _registry(name: str, **options: Any) -> Controller:
    from models import registry

    return registry.make(name, **options)


def _copart(node: Node, clock: Clock | None, opts: dict, cls: type[CoPart] = CoPart) -> Controller:
    from models.copart import stream_profile_sim

    stream = stream_profile_sim(node) if _sim(node) is not None else None
    return cls(stream, **opts)


def _static(node: Node, clock: Clock | None, opts: dict) -> Controller:
    from models.basic import Unpartitioned
    from models.static import StaticController, calibrate

    lcs = _lc_groups(node)
    lc = opts.pop("lc_group", lcs[0] if lcs else None)
    if lc is None:
        return Unpartitioned()  # no mite to protect: everyone shares the cache
    if "ways" in opts:
        return StaticController(lc, int(opts.pop("ways")))
    where, wclock, owned = _twin(node, clock)
    opts = {"measure_s": 2.0, "warmup_s": 0.3, **opts}
    try:
        sweep = calibrate(where, wclock, lc, **opts)
    finally:
        if owned:
            where.close()
    return StaticController.from_sweep(sweep)


def _ubik(node: Node, clock: Clock | None, opts: dict, strict_lc: bool = False) -> Controller:
    from models.ubik import StaticLC, Ubik, calibrate

    profiles = opts.pop("profiles", None)
    if profiles is None and _lc_groups(node):
        where, wclock, owned = _twin(node, clock)
        try:
            profiles = calibrate(where, wclock, measure_intervals=10, min_requests=1000)
        finally:
            if owned:
                where.close()
    return (StaticLC if strict_lc else Ubik)(profiles, **opts)


def _best_static(node: Node, clock: Clock | None, opts: dict) -> Controller:
    from models.static import BestStatic

    ctl = BestStatic(**opts)
    ctl.fit(node, clock)
    return ctl


def _oracle(node: Node, clock: Clock | None, opts: dict) -> Controller:
    from models.oracle import Oracle

    return Oracle(node, **opts)


def _time_sharing(node: Node, clock: Clock | None, opts: dict, kind: str) -> Controller:
    from agent.types import SLO
    from models.coco import CoCo, RoundRobin, Service, calibrate, prepare_groups

    sim = _sim(node)
    if sim is None:
        raise ValueError(f"{kind} in rdtune eval needs a simulated node (it lists the services)")
    if sim.groups():
        raise ValueError(f"{kind} needs a node without per-workload groups (auto_groups=False)")
    views = sim.workloads()
    services = [
        Service(w.name, frozenset(w.pids), SLO(w.spec.lc.slo_percentile, w.spec.lc.slo_ms))
        for w in views
        if w.kind == "lc"
    ]
    if not services:
        raise ValueError(f"{kind} needs LC services in the scenario")
    background = [p for w in views if w.kind != "lc" for p in w.pids]
    groups = prepare_groups(node, services[0].slo)
    opts = {"slice_s": 1.0, **opts}
    if kind == "round_robin":
        return RoundRobin(services, groups, background_pids=background, **opts)
    twin = copy.deepcopy(sim)
    try:
        profile = calibrate(twin, twin, services, groups, background_pids=background)
    finally:
        twin.close()
    return CoCo(services, groups, profile=profile, background_pids=background, **opts)


def _policy(node: Node, clock: Clock | None, opts: dict) -> Controller:
    from models.policy import PolicyController

    return PolicyController(opts.pop("path", None), **opts)


BUILDERS = {
    "unpartitioned": lambda n, c, o: _registry("unpartitioned", **o),
    "eq": lambda n, c, o: _registry("eq", **o),
    "explore": lambda n, c, o: _registry("explore", **o),
    "copart": _copart,
    "copart_cat": lambda n, c, o: _copart(n, c, o, CoPartCatOnly),
    "copart_mba": lambda n, c, o: _copart(n, c, o, CoPartMbaOnly),
    "best_static": _best_static,
    "oracle": _oracle,
    "static": _static,
    "ubik": _ubik,
    "static_lc": lambda n, c, o: _ubik(n, c, o, strict_lc=True),
    "ucp": lambda n, c, o: UcpStyle(**o),
    "coco": lambda n, c, o: _time_sharing(n, c, o, "coco"),
    "round_robin": lambda n, c, o: _time_sharing(n, c, o, "round_robin"),
    "policy": _policy,
}


def build(
    spec: ControllerSpec | str, node: Node, clock: Clock | None = None, interval_s: float = 0.1
) -> Controller:
    """A controller for ``node`` as it is now (scenario loaded, groups created), driven
    every ``interval_s``; the option ``decide_s`` (any controller) makes it decide only
    every ``decide_s`` seconds (:class:`Every`)."""
    if isinstance(spec, str):
        spec = ControllerSpec.parse(spec)
    opts = dict(spec.options)
    decide_s = opts.pop("decide_s", None)
    try:
        ctl = BUILDERS[spec.name](node, clock, opts)
    except TypeError as exc:  # unknown keyword options
        raise ValueError(f"bad options for controller {spec.label!r}: {exc}") from None
    if decide_s is not None:
        k = round(float(decide_s) / interval_s)
        if k < 1 or abs(k * interval_s - float(decide_s)) > 1e-6:
            raise ValueError(
                f"decide_s={decide_s} must be a whole number of {interval_s:g} s intervals"
            )
        if k > 1:
            ctl = Every(ctl, k)
    return ctl


def policy_available() -> bool:
    from models.policy import DEFAULT_POLICY

    return (DEFAULT_POLICY / "model_card.json").is_file()


__all__ = [
    "BUILDERS",
    "CoPartCatOnly",
    "CoPartMbaOnly",
    "ControllerSpec",
    "UcpStyle",
    "build",
    "needs_bare_node",
    "policy_available",
    "split_specs",
]

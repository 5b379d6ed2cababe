"""Every controller only ever emits valid plans, on every machine preset.

Each entry of :data:`CONTROLLERS` builds a controller (and the node it runs on) for a preset;
the run checks every plan with agent.validate.validate_plan against what the node holds
before applying it. Baseline engineers: add your controllers to ``CONTROLLERS``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent.sim import SimNode, random_scenario
from agent.sim.catalog import default_catalog
from agent.types import SLO, GroupKind
from agent.validate import PlanContext, validate_plan
from models.controller import Controller, carry_out, context

PRESETS = sorted(default_catalog().machines)
INTERVALS = 30


def _mixed_node(preset: str, seed: int) -> SimNode:
    """A seeded LC + batch mix on ``preset`` (one group per workload)."""
    return SimNode(random_scenario(seed, preset, max_lc=2, max_batch=4), seed=seed, noise=True)


def _ubik(preset: str, seed: int) -> tuple[Controller, SimNode]:
    from models.ubik import Ubik

    return Ubik(slack=0.05, period=3, ref_intervals=3, probe_every=3), _mixed_node(preset, seed)


def _static_lc(preset: str, seed: int) -> tuple[Controller, SimNode]:
    from models.ubik import StaticLC

    return StaticLC(), _mixed_node(preset, seed)


def _time_sharing(kind: str) -> Callable[[str, int], tuple[Controller, SimNode]]:
    def build(preset: str, seed: int) -> tuple[Controller, SimNode]:
        from models.coco import CoCo, RoundRobin, Service, prepare_groups

        scn = random_scenario(seed, preset, max_lc=2, max_batch=3)
        node = SimNode(scn, seed=seed, auto_groups=False)
        wl = node.workloads()
        lc = [w for w in wl if w.kind == "lc"] or wl[:1]
        services = [
            Service(
                w.name,
                frozenset(w.pids),
                SLO(w.spec.lc.slo_percentile, w.spec.lc.slo_ms) if w.spec.lc else SLO(99.0, 1.0),
            )
            for w in lc
        ]
        bg = [p for w in wl if w not in lc for p in w.pids]
        groups = prepare_groups(node, services[0].slo)
        cls = CoCo if kind == "coco" else RoundRobin
        return cls(services, groups, background_pids=bg, slice_s=0.3), node

    return build


def _static(preset: str, seed: int) -> tuple[Controller, SimNode]:
    from models.static import StaticController, calibrate

    node = _mixed_node(preset, seed)
    lc = [g for g, s in node.groups().items() if s.kind is GroupKind.LC]
    if lc:
        sweep = calibrate(node, node, lc[0], measure_s=0.2, warmup_s=0.1)
        return StaticController.from_sweep(sweep), node
    return StaticController(next(iter(node.groups())), 2), node


def _best_static(preset: str, seed: int) -> tuple[Controller, SimNode]:
    from models.static import BestStatic

    node = _mixed_node(preset, seed)
    best = BestStatic(max_evals=12)
    best.fit(node)
    return best, node


def _copart(preset: str, seed: int) -> tuple[Controller, SimNode]:
    from models.copart import CoPart, stream_profile_sim

    node = _mixed_node(preset, seed)
    return CoPart(stream_profile_sim(node), period=2, profile_intervals=2, seed=seed), node


def _oracle(preset: str, seed: int) -> tuple[Controller, SimNode]:
    from models.oracle import Oracle

    node = _mixed_node(preset, seed)
    return Oracle(node, max_evals=12), node


CONTROLLERS: dict[str, Callable[[str, int], tuple[Controller, SimNode]]] = {
    "static": _static,
    "best_static": _best_static,
    "copart": _copart,
    "oracle": _oracle,
    "ubik": _ubik,
    "static_lc": _static_lc,
    "coco": _time_sharing("coco"),
    "round_robin": _time_sharing("round_robin"),
}


@pytest.mark.parametrize("seed", [3, 7])
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("name", sorted(CONTROLLERS))
def test_only_valid_plans(name: str, preset: str, seed: int) -> None:
    ctrl, node = CONTROLLERS[name](preset, seed)
    caps = node.capabilities()
    plans = 0

    def check_and_apply(decision) -> None:
        nonlocal plans
        if decision.plan is not None:
            exclusive = frozenset(g for g, s in node.groups().items() if s.exclusive)
            ctx = PlanContext(caps=caps, current=node.allocation(), exclusive=exclusive)
            validate_plan(decision.plan, ctx)  # raises InvalidAllocation on any broken rule
            plans += 1
        carry_out(node, decision)

    check_and_apply(ctrl.start(context(node, tasks=ctrl.needs_tasks)))
    node.observe()
    for _ in range(INTERVALS):
        node.advance(0.1)
        snap = node.observe()
        check_and_apply(ctrl.decide(snap, context(node, tasks=ctrl.needs_tasks, time_s=node.now())))
    assert plans >= 1  # the controller did partition something
    assert any(s.kind is not GroupKind.SYSTEM for s in node.groups().values())

"""The SLO guard's fallback in charge must protect: candidates checked again when the groups
change, the next candidate taking over from one whose plans are dropped, and the guard
backing off a primary that keeps failing. In-process SimNode, the real tuner."""

from __future__ import annotations

import logging

import pytest

from agent.sim import SimNode
from agent.types import GroupKind, GroupSpec
from agent.validate import PlanContext, validate_plan
from models import catalogue
from tests.tuner.conftest import write_yaml
from tests.tuner.controllers import Broken
from tuner.config import GuardConfig, TunerConfig
from tuner.service import Tuner

# memcached far over its capacity: every controller misses its SLO, the guard trips.
OVERLOAD = {
    "description": "memcached overloaded beside three batch jobs",
    "machine": "gold6130",
    "workloads": [
        {"workload": "memcached", "load": {"kind": "constant", "utilization": 1.5}},
        {"workload": "ocean_cp"},
        {"workload": "CG"},
        {"workload": "FT"},
    ],
}


@pytest.fixture(scope="module")
def overload() -> str:
    return write_yaml(OVERLOAD)


def tuner_on(scenario: str, fallbacks, **guard) -> Tuner:
    cfg = TunerConfig(
        interval_s=0.5,
        metrics_listen="",
        guard=GuardConfig(**{"violation_intervals": 2, "stable_intervals": 10**6, **guard}),
    )
    node = SimNode(scenario, seed=0)
    return Tuner(lambda: node, lambda n: catalogue.construct("eq"), cfg, fallbacks)


def static8():
    return catalogue.construct("static[lc_group=memcached,ways=8]")


def make_exclusive(tuner: Tuner) -> None:
    """Another client's exclusive group (a runtime class), which static shares ways with."""
    tuner.node.create_group(GroupSpec("x", GroupKind.BATCH, None, exclusive=True))


CASES = {
    "exclusive_group_before_the_trip": (static8, 0),
    "exclusive_group_while_the_fallback_serves": (static8, 5),
    "fallback_plan_dropped": (Broken, None),
}


@pytest.mark.parametrize(("fallback", "exclusive_at"), CASES.values(), ids=CASES.keys())
def test_a_fallback_that_cannot_protect_hands_over_to_one_that_can(
    overload: str, fallback, exclusive_at: int | None, caplog
) -> None:
    tuner = tuner_on(overload, [fallback()])
    tuner.start()
    outcomes = []
    for i in range(30):
        if i == exclusive_at:
            make_exclusive(tuner)
        outcomes.append(tuner.step().outcome)
    assert tuner.slo_guard.in_fallback and tuner.fallback.name == "eq"
    assert "dropped" not in outcomes[-10:]
    held = tuner.node.allocation()
    exclusive = frozenset(g for g, s in tuner.node.groups().items() if s.exclusive)
    validate_plan(held.as_plan(), PlanContext(tuner.caps, held, exclusive))
    masks = {g: p[0].l3_mask for g, p in held.groups.items()}
    assert len(set(masks.values())) == len(masks), "eq gives every group ways of its own"
    changed = [r for r in caplog.records if getattr(r, "event", "") == "fallback_changed"]
    assert len(changed) == 1 and changed[0].levelno == logging.ERROR
    tuner.shutdown()


def test_the_configured_fallback_serves_again_once_the_exclusive_group_is_gone(
    overload: str, caplog
) -> None:
    tuner = tuner_on(overload, [static8()])
    tuner.start()
    make_exclusive(tuner)
    for _ in range(5):
        tuner.step()
    assert tuner.fallback.name == "eq"
    tuner.node.delete_group("x")
    for _ in range(5):
        tuner.step()
    assert tuner.fallback.name == "static" and tuner.slo_guard.in_fallback
    changed = [r for r in caplog.records if getattr(r, "event", "") == "fallback_changed"]
    assert [(r.to, r.levelno) for r in changed] == [
        ("eq", logging.ERROR),
        ("static", logging.WARNING),
    ]
    tuner.shutdown()


def test_an_exclusive_group_made_during_an_outage_hands_the_fallback_over(
    overload: str, caplog
) -> None:
    """The agent back after an outage with another client's exclusive group: the groups
    the tuner reads back hold it already, so only reconcile can follow the change."""
    tuner = tuner_on(overload, [static8()])
    tuner.start()
    make_exclusive(tuner)
    tuner.reconcile()  # as the tuner does when the agent answers again
    outcomes = [tuner.step().outcome for _ in range(10)]
    assert tuner.slo_guard.in_fallback and tuner.fallback.name == "eq"
    assert "dropped" not in outcomes
    tuner.shutdown()


# memcached at 75% load beside three memory-heavy batch jobs: eq starves it, a static
# split of 8 ways protects it, so the guard keeps switching between them.
TIGHT = {**OVERLOAD, "description": "memcached at 75% load beside memory-heavy batch jobs"}
TIGHT["workloads"] = [
    {"workload": "memcached", "load": {"kind": "constant", "utilization": 0.75}},
    *OVERLOAD["workloads"][1:],
]


def test_a_flapping_guard_backs_off_and_the_lc_group_is_protected_longer() -> None:
    tuner = tuner_on(write_yaml(TIGHT), [static8()], violation_intervals=3, stable_intervals=10)
    tuner.start()
    for _ in range(120):
        tuner.step()
    needed = tuner.metrics.registry.get_sample_value("rdtune_tuner_guard_stable_intervals")
    met, missed = (
        tuner.metrics.registry.get_sample_value(
            "rdtune_tuner_slo_intervals_total", {"group": "memcached", "result": r}
        )
        for r in ("met", "violated")
    )
    tuner.shutdown()
    # Without backing off: 15 switches, 8 trips, needed 10 throughout, 59% attainment.
    assert tuner.switches.count <= 8 and needed >= 40
    assert met / (met + missed) > 0.75


def test_a_replaced_fallback_leaves_the_controller_in_charge_metric(overload: str) -> None:
    """Before, the fallback replaced while in charge kept its series at 1: two controllers
    in charge in every scrape, and in ``rdtune status``."""
    tuner = tuner_on(overload, [static8()])
    tuner.start()
    for i in range(30):
        if i == 5:
            make_exclusive(tuner)
        tuner.step()
    assert tuner.fallback.name == "eq" and tuner.slo_guard.in_fallback
    series = {
        (s.labels["controller"], s.labels["role"]): s.value
        for family in tuner.metrics.registry.collect()
        if family.name == "rdtune_tuner_active_controller"
        for s in family.samples
    }
    tuner.shutdown()
    assert series == {("eq", "primary"): 0, ("eq", "fallback"): 1}

"""The tuner loop in-process against a real agent on loopback (RemoteNode): change limits and
dwell time enforced interval by interval, limited plans carried on to their target, groups
created and adopted from the config, metrics."""

from __future__ import annotations

import itertools
import logging
import re
import statistics
import threading
import time

import pytest

from agent.sim import SimNode
from agent.types import SLO, AllocationPlan, GroupKind, GroupSpec, popcount
from models import catalogue
from tests.agent.server.conftest import serve
from tests.agent.server.refnode import RefNode
from tests.tuner.conftest import assert_valid
from tests.tuner.controllers import BadMove, Crashy, Mover, Swing
from tuner.config import AgentConnection, GroupConfig, GuardConfig, TunerConfig
from tuner.controllers import fallback
from tuner.service import Tuner


@pytest.fixture
def server():
    with serve(SimNode("default", seed=0)) as srv:
        yield srv


def make_tuner(server, controller, **cfg) -> Tuner:
    guard = cfg.pop("guard", GuardConfig())
    backup = cfg.pop("fallback", None) or fallback()
    config = TunerConfig(
        guard=guard,
        agent=AgentConnection(address=server.address, timeout_s=10),
        metrics_listen="",
        **{"interval_s": 0.1, **cfg},
    )
    return Tuner(config.agent.connect, lambda node: controller, config, backup)


def held(tuner: Tuner) -> dict[str, tuple[int, int]]:
    alloc = tuner.node.allocation()
    return {g: (p[0].l3_mask, p[0].mb) for g, p in alloc.groups.items()}


def test_way_and_mb_steps_and_dwell_are_enforced_every_interval(server) -> None:
    guard = GuardConfig(max_way_step=1, max_mb_step=2, min_dwell_s=0.3, violation_intervals=10**6)
    tuner = make_tuner(server, Swing(), guard=guard)
    tuner.start()
    gran = tuner.caps.mba.bandwidth_gran
    history = [(0.0, held(tuner))]
    changes = 0
    for _ in range(40):
        result = tuner.step()
        history.append((result.snapshot.timestamp, held(tuner)))
        changes += result.outcome in ("applied", "limited")
    assert changes >= 10, "the swinging controller keeps the tuner busy"
    last_change: dict[str, float] = {}
    for (_, before), (t, after) in itertools.pairwise(history):
        for g in after:
            (m0, mb0), (m1, mb1) = before[g], after[g]
            assert popcount(m0 ^ m1) <= 1, f"{g}: {m0:#x} -> {m1:#x} at {t}"
            assert abs(mb1 - mb0) <= 2 * gran, f"{g}: MB {mb0} -> {mb1} at {t}"
            if (m0, mb0) != (m1, mb1):
                if g in last_change:
                    assert t - last_change[g] >= 0.3 - 1e-9, f"{g} changed again at {t}"
                last_change[g] = t
    assert_valid(tuner.node)
    limited = [
        s for m in tuner.metrics.registry.collect() for s in m.samples
        if s.name == "rdtune_tuner_limited_plans_total"
    ]  # fmt: skip
    assert {s.labels["limit"] for s in limited if s.value} >= {"ways", "dwell"}
    tuner.shutdown()


def test_a_limited_plan_is_carried_on_until_reached(server) -> None:
    """eq decides once; with one way per interval the tuner keeps moving toward its plan."""
    tuner = make_tuner(server, catalogue.construct("eq"), guard=GuardConfig(max_way_step=1))
    tuner.start()
    first = held(tuner)
    for _ in range(12):
        tuner.step()
    final = held(tuner)
    assert first != final
    assert tuner.target is None, "target reached"
    eq = catalogue.construct("eq")
    from models.controller import context

    want = eq.start(context(tuner.node)).plan
    assert {g: (p[0].l3_mask) for g, p in want.groups.items()} == {
        g: m for g, (m, _) in final.items()
    }
    tuner.shutdown()


def test_groups_from_the_config_are_created_or_adopted(server, tmp_path) -> None:
    cgroup = tmp_path / "web.slice"
    cgroup.mkdir()
    node = SimNode("default", seed=0)  # same scenario: same pids as the served node
    pids = sorted(node.tasks("memcached"))
    (cgroup / "cgroup.procs").write_text(f"{pids[0]}\n{pids[1]}\n")
    groups = [
        GroupConfig(GroupSpec("web", GroupKind.LC, SLO(99.0, 2.0)), cgroup=str(cgroup)),
        GroupConfig(GroupSpec("memcached"), pids=(pids[2], 999999)),  # exists; one unknown pid
    ]
    tuner = make_tuner(server, catalogue.construct("eq"), groups=groups, resync_intervals=2)
    tuner.start()
    assert tuner.groups["web"] == GroupSpec("web", GroupKind.LC, SLO(99.0, 2.0))
    assert tuner.groups["memcached"].kind is GroupKind.LC, "adopted as it is"
    assert tuner.node.tasks("web") == frozenset(pids[:2])
    assert pids[2] in tuner.node.tasks("memcached")
    # A task joining the cgroup later (a restarted worker) follows at the next resync.
    (cgroup / "cgroup.procs").write_text(f"{pids[0]}\n{pids[1]}\n{pids[3]}\n")
    tuner.step()
    assert pids[3] not in tuner.node.tasks("web")
    tuner.step()
    assert tuner.node.tasks("web") == frozenset([pids[0], pids[1], pids[3]])
    assert_valid(tuner.node)
    tuner.shutdown()


def test_configured_pids_that_exited_leave_the_live_ones_placed_and_one_warning(
    server, caplog
) -> None:
    """A configured group whose listed pids have partly exited: the live one is placed
    (the node refuses a move naming an exited task as a whole) and the exited ones are
    named together in one warning, not one line per task."""
    live = sorted(SimNode("default", seed=0).tasks("memcached"))[0]  # the served node's
    groups = [GroupConfig(GroupSpec("web"), pids=(999998, live, 999999))]
    tuner = make_tuner(server, catalogue.construct("eq"), groups=groups)
    caplog.set_level(logging.WARNING, logger="rdtune.tuner")
    tuner.start()
    assert tuner.node.tasks("web") == frozenset([live])
    warned = [r for r in caplog.records if getattr(r, "event", None) == "assign_failed"]
    assert [(r.group, r.pids) for r in warned] == [("web", [999998, 999999])]
    assert "exited" in warned[0].getMessage()
    tuner.shutdown()


def test_a_controller_that_cannot_start_on_the_node_is_a_clear_refusal(server) -> None:
    """An option the node cannot honour, found when the controller first looks at it (a
    static split wider than its cache), is the controller's error (rdtune tune exits 2),
    and the groups this start created are removed again."""
    from models.setup import ControllerError

    static = catalogue.construct("static[lc_group=web,ways=999]")
    groups = [GroupConfig(GroupSpec("web", GroupKind.LC, SLO(99.0, 2.0)))]
    tuner = make_tuner(server, static, groups=groups)
    said = "cannot start on this node: ways must be in 1..10 on this node (the LC group's own"
    with pytest.raises(ControllerError, match=re.escape(said)):
        tuner.start()
    assert "web" not in tuner.node.groups()
    tuner.shutdown()


def test_a_new_exclusive_group_is_separated_under_way_steps(server) -> None:
    """An exclusive group made at start overlaps every way; with one way per interval no
    step can separate it, so the first plan is applied whole instead of the tuner failing."""
    excl = [GroupConfig(GroupSpec("excl", GroupKind.BATCH, None, exclusive=True))]
    guard = GuardConfig(max_way_step=1, violation_intervals=10**6)
    eq = catalogue.construct("eq")
    tuner = make_tuner(server, eq, groups=excl, guard=guard, fallback=catalogue.construct("eq"))
    tuner.start()
    for _ in range(3):
        assert tuner.step().outcome != "error"
    held = assert_valid(tuner.node)
    mine = held["excl"][0].l3_mask
    assert mine and all(not mine & a[0].l3_mask for g, a in held.groups.items() if g != "excl")
    tuner.shutdown()


def test_a_start_whose_first_plan_fails_removes_the_groups_it_made(server) -> None:
    """The node as it was: the start's first decision is part of the start it undoes."""
    groups = [GroupConfig(GroupSpec("aaa", GroupKind.BATCH))]
    tuner = make_tuner(server, BadMove(), groups=groups)
    with pytest.raises(TypeError, match="integer"):
        tuner.start()
    assert "aaa" not in tuner.node.groups()
    tuner.shutdown()


def test_an_lc_group_never_judged_is_exported_and_warned_about_once(server, caplog) -> None:
    """An LC group whose latency never arrives (no feed, no requests) blinds the guard:
    its unjudged intervals in a row are exported, and said once at stable_intervals."""
    web = [GroupConfig(GroupSpec("web", GroupKind.LC, SLO(99.0, 5.0)))]
    guard = GuardConfig(stable_intervals=4)
    tuner = make_tuner(server, catalogue.construct("eq"), groups=web, guard=guard)
    tuner.start()
    for _ in range(9):
        tuner.step()
    value = tuner.metrics.registry.get_sample_value
    assert value("rdtune_tuner_slo_unjudged_intervals", {"group": "web"}) == 9
    assert value("rdtune_tuner_slo_unjudged_intervals", {"group": "memcached"}) == 0
    said = [r for r in caplog.records if getattr(r, "event", "") == "slo_unjudged"]
    assert [(r.group, r.intervals) for r in said] == [("web", 4)]
    tuner.shutdown()


def test_a_task_that_exited_does_not_keep_the_others_of_its_move_out(server) -> None:
    """Tasks exit all the time: a move naming one that has is carried out for the rest."""
    tuner = make_tuner(server, Mover())
    tuner.start()
    first, *_, last = sorted(tuner.node.groups())
    assert tuner.node.tasks(last) == frozenset()
    assert len(tuner.node.tasks(first)) == 8  # its own four tasks and the last group's four
    tuner.shutdown()


def test_run_stops_on_the_event(server) -> None:
    tuner = make_tuner(server, catalogue.construct("eq"), realtime=True)
    stop = threading.Event()
    timer = threading.Timer(0.5, stop.set)
    timer.start()
    assert tuner.run(stop) == 0
    # Paced by the wall clock (0.1 s intervals for 0.5 s), not spinning on the sim clock;
    # a loaded machine may fit fewer.
    assert 0 <= tuner.intervals <= 7
    hist = [
        s for m in tuner.metrics.registry.collect() for s in m.samples
        if s.name == "rdtune_tuner_decision_latency_seconds_count"
    ]  # fmt: skip
    assert sum(s.value for s in hist) == tuner.intervals
    tuner.shutdown()


def test_decision_latency_times_decisions_not_a_cadences_waits(server) -> None:
    """A controller deciding every 5th interval (catalogue option decide_s): the histogram
    holds its decisions, not the intervals in between (each a microsecond of nothing)."""
    from models.cadence import Every

    tuner = make_tuner(server, Every(catalogue.construct("eq"), 5))
    tuner.start()
    for _ in range(11):
        tuner.step()
    hist = [
        s for m in tuner.metrics.registry.collect() for s in m.samples
        if s.name == "rdtune_tuner_decision_latency_seconds_count"
    ]  # fmt: skip
    # the first decision after one interval, then every 5th: intervals 1, 6 and 11
    assert sum(s.value for s in hist) == 3
    tuner.shutdown()


def test_an_allocation_changed_behind_the_tuners_back_is_put_back(server) -> None:
    """Between read-backs the tuner trusts its last apply; every resync_intervals it reads
    the node and re-asserts its allocation where the node holds something else."""
    tuner = make_tuner(server, catalogue.construct("eq"), resync_intervals=3)
    tuner.start()
    mine = tuner.node.allocation()
    from agent.client import RemoteNode
    from models.allocation import full_allocation

    with RemoteNode(server.address) as other:  # an operator's manual write
        full = full_allocation(other.capabilities())
        other.apply(AllocationPlan.uniform({"memcached": full}, tuner.caps.domains))
    for _ in range(3):
        tuner.step()
    assert tuner.node.allocation() == mine
    assert_valid(tuner.node)
    tuner.shutdown()


def test_metrics_after_a_guard_trip_and_recovery(spike_file: str, monkeypatch) -> None:
    from tuner import service

    # a guard flapping for days kept every switch in memory and printed them all at stop
    monkeypatch.setattr(service, "KEPT_SWITCHES", 1)
    with serve(SimNode(spike_file, seed=0)) as srv:
        guard = GuardConfig(violation_intervals=3, stable_intervals=8)
        tuner = make_tuner(srv, catalogue.construct("eq"), guard=guard)
        tuner.start()
        for _ in range(140):
            tuner.step()
        tuner.shutdown()
    m = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in tuner.metrics.registry.collect()
        for s in metric.samples
    }

    def get(name: str, **labels) -> float:
        return m[(name, tuple(sorted(labels.items())))]

    assert [s.to_fallback for s in tuner.switches] == [False] and tuner.switches.count == 2
    fb = tuner.fallback.name
    assert get("rdtune_tuner_guard_trips_total", group="memcached") == 1
    assert get("rdtune_tuner_controller_switches_total", from_controller="eq", to_controller=fb)
    assert get("rdtune_tuner_fallback_active") == 0
    assert get("rdtune_tuner_intervals_total") == 140
    assert get("rdtune_tuner_loop_latency_seconds_count") == 140
    met = get("rdtune_tuner_slo_intervals_total", group="memcached", result="met")
    missed = get("rdtune_tuner_slo_intervals_total", group="memcached", result="violated")
    assert met > 0 and missed >= 3
    ratio = get("rdtune_tuner_slo_attainment_ratio", group="memcached")
    assert ratio == pytest.approx(met / (met + missed))
    assert 0 < get("rdtune_tuner_tail_latency_seconds", group="memcached") < 1
    assert get("rdtune_tuner_batch_instructions_per_second", group="ocean_cp") > 0
    held = tuner.intended.groups["memcached"]
    assert len(held) == len(tuner.caps.l3.domains)  # every cache domain, not the first
    for domain, a in held.items():
        assert get("rdtune_tuner_group_l3_ways", group="memcached", domain=str(domain)) == a.ways
        assert get("rdtune_tuner_group_mba_ratio", group="memcached", domain=str(domain)) == (
            a.mb / 100
        )


def test_a_failing_controller_keeps_the_allocation_and_is_counted(server) -> None:
    tuner = make_tuner(server, Crashy())
    tuner.start()
    before = tuner.node.allocation()
    outcomes = [tuner.step().outcome for _ in range(6)]
    assert outcomes == ["kept", "kept", "error"] * 2
    assert tuner.node.allocation() == before
    errors = [
        s for m in tuner.metrics.registry.collect() for s in m.samples
        if s.name == "rdtune_tuner_decisions_total" and s.labels["outcome"] == "error"
    ]  # fmt: skip
    assert errors[0].value == 2
    tuner.shutdown()


def _rpcs(server, method: str) -> float:
    return sum(
        s.value
        for family in server.metrics.registry.collect()
        for s in family.samples
        if s.name == "rdtune_agent_rpcs_total" and s.labels["method"] == method
    )


def test_each_interval_is_one_step_message_on_a_simulated_node(server) -> None:
    """The apply of an interval and the observation starting the next are one Step (the
    clock's advance included), not Apply + Advance + Observe."""
    tuner = make_tuner(server, Swing(), guard=GuardConfig(violation_intervals=10**6))
    assert tuner.run(threading.Event(), max_intervals=12) == 0
    outcomes = tuner.metrics.registry.get_sample_value(
        "rdtune_tuner_decisions_total", {"controller": "swing", "outcome": "applied"}
    )
    assert outcomes and outcomes >= 10, "the controller applied a plan every interval"
    # The first interval observes by itself (the start's step only starts it) and the last
    # applies alone (no interval follows); every one between is a single Step.
    assert _rpcs(server, "Step") >= 11
    assert _rpcs(server, "Observe") <= 1 and _rpcs(server, "Advance") <= 1
    assert _rpcs(server, "Apply") <= 1
    assert tuner.node.now() == pytest.approx(12 * 0.1), "one interval of simulated time each"
    tuner.shutdown()


class WallNode(RefNode):
    """A RefNode on the wall clock: each observation spans the real time since the last."""

    def __init__(self) -> None:
        super().__init__()
        self._t0 = time.monotonic()
        self.intervals: list[float] = []

    def observe(self):
        self.tick(time.monotonic() - self._t0 - self._t)
        snap = super().observe()
        self.intervals.append(snap.interval_s)
        return snap


def test_each_interval_is_one_step_message_on_a_wall_clock_node() -> None:
    """On a real node the step waits at the agent until the next tick: the tuner keeps its
    fixed rate with one message per interval."""
    node = WallNode()
    for name in ("a", "b"):
        node.create_group(GroupSpec(name))
    with serve(node) as srv:
        tuner = make_tuner(srv, Swing(), interval_s=0.05)
        started = time.monotonic()
        assert tuner.run(threading.Event(), max_intervals=16) == 0
        took = time.monotonic() - started
        assert _rpcs(srv, "Step") >= 15
        assert _rpcs(srv, "Observe") <= 1 and _rpcs(srv, "Apply") <= 1
        tuner.shutdown()
    assert took >= 15 * 0.05, "paced by the wall clock, not spinning"
    # The observations come at the tuner's rate (the start's and the first are shorter):
    # each step waited at the node for its tick (not far below 0.05 s) and the tuner kept
    # up (bounds wide enough for a loaded host's scheduling).
    assert 0.03 <= statistics.median(node.intervals[2:]) <= 0.15

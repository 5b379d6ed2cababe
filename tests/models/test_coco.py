"""CoCo time-sharing and the round-robin baseline on 4-CLOS presets."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from agent.errors import UnknownTask
from agent.sim import LoadProfile, SimNode, get_scenario
from agent.sim.catalog import default_catalog
from agent.types import SLO
from models.coco import (
    LINE_BYTES,
    CoCo,
    RoundRobin,
    Service,
    ServiceProfile,
    calibrate,
    prepare_groups,
    tier_shapes,
)
from models.controller import KEEP, carry_out, context, drive
from models.objectives import slo_met

EPYC = "more_lc_than_closids_epyc"


def _contested(name: str = EPYC, load: float = 0.45):
    """The library scenario with every LC service at ``load``: at its own 30% the one
    exclusive tier is contested by three services on the EPYC, and CoCo's admission control
    drops one to best effort where round robin still lends it the tier now and then."""
    base = get_scenario(name)
    lp = LoadProfile("constant", load, "utilization")
    ws = tuple(dataclasses.replace(w, load=lp) if w.load else w for w in base.workloads)
    return dataclasses.replace(base, name=f"{name}@{load}", workloads=ws)


def _setup(scenario=EPYC, seed=2):
    node = SimNode(scenario, seed=seed, noise=False, auto_groups=False)
    wl = node.workloads()
    services = [Service(w.name, frozenset(w.pids), w.slo) for w in wl if w.kind == "lc"]
    background = [p for w in wl if w.kind != "lc" for p in w.pids]
    loosest = max(services, key=lambda s: s.slo.target_ms).slo
    return node, services, background, prepare_groups(node, loosest)


def _violations(ctrl, node, services, intervals=60):
    """SLO violations per (service, interval), judged on the simulator's ground truth of
    each service's tail at the placement the controller chose (tests may use it)."""
    slo = {s.name: s.slo for s in services}
    carry_out(node, ctrl.start(context(node, tasks=True)))
    node.observe()
    bad = 0
    for _ in range(intervals):
        node.advance(0.1)
        snap = node.observe()
        for truth in node.steady_state().values():
            for name, w in truth.workloads.items():
                if name in slo:
                    bad += not slo_met(w.latency_ms[slo[name].percentile], slo[name].target_ms)
        carry_out(node, ctrl.decide(snap, context(node, tasks=True, time_s=node.now())))
    return bad


@pytest.fixture(scope="module")
def profile():
    node, services, background, groups = _setup(seed=1)
    return calibrate(node, node, services, groups, background_pids=background)


def test_profile_shows_sensitivity(profile):
    assert set(profile) == {"memcached_coco", "nginx", "mongodb", "specjbb", "shore_mt"}
    for name, p in profile.items():
        assert p.slowdown(1) > p.slowdown(2) >= 1.0  # the shared tier is the slow one
        # MongoDB's tail is its I/O (PARTIES), nginx's its workers' stalls
        # (docs/SIMULATOR.md): neither follows the CPU slowdown beyond measurement noise.
        lc = default_catalog().workload(name).lc
        if p.slowdown(1) > 1.1 and not (lc.io_ms or lc.stall_ms):
            assert p.tails[1] > p.tails[2]
        assert p.held_bytes > 0
    assert sum(p.slowdown(1) > 1.1 for p in profile.values()) >= 3


def test_coco_serves_more_lc_than_closids_with_fewer_violations_than_round_robin():
    scn = _contested()
    node, services, background, groups = _setup(scn, seed=1)
    profile = calibrate(node, node, services, groups, background_pids=background)
    node, services, background, groups = _setup(scn)
    caps = node.capabilities()
    assert len(services) > caps.num_closids  # 5 LC services, 4 CLOS incl. the default
    rr = _violations(RoundRobin(services, groups, background_pids=background), node, services)
    node, services, background, groups = _setup(scn)
    coco = CoCo(services, groups, profile=profile, background_pids=background)
    cc = _violations(coco, node, services)
    assert rr > 0
    assert cc < rr
    # The large tier goes to services whose profile misses the SLO in the shared tier.
    for name in coco._queues[2]:
        slo = next(s.slo for s in services if s.name == name)
        assert profile[name].tails[1] > coco.margin * slo.target_ms
    assert node.tasks(groups[0]) >= set(background)  # background tasks in their own CLOS


def _needy_profile(services, slow: set[str], cpi: dict[str, float]) -> dict:
    """Profiles in which the ``slow`` services miss their SLO in the shared tier."""
    return {
        s.name: ServiceProfile(
            tails={1: (10 if s.name in slow else 0.1) * s.slo.target_ms, 2: 0.1},
            cpi={1: cpi.get(s.name, 1.5), 2: 1.0},
            cpi_full=1.0,
        )
        for s in services
    }


def test_admission_control_drops_what_cannot_be_afforded():
    node, services, background, groups = _setup()
    # three services need the one higher tier; at most two may time-share it
    prof = _needy_profile(
        services, {"mongodb", "shore_mt", "nginx"}, {"shore_mt": 2.0, "mongodb": 1.5, "nginx": 1.2}
    )
    coco = CoCo(services, groups, profile=prof, background_pids=background)
    d = coco.start(context(node, tasks=True))
    assert coco._queues == {2: ["shore_mt", "mongodb"]}  # the higher slowdowns keep it
    assert coco._dropped == ["nginx"]
    carry_out(node, d)
    node.observe()
    node.advance(0.1)
    d = coco.decide(node.observe(), context(node, tasks=True, time_s=node.now()))
    assert "dropped ['nginx']" in (coco._note or "")


def test_contested_tier_is_time_shared_by_weight():
    node, services, background, groups = _setup()
    prof = _needy_profile(services, {"mongodb", "shore_mt"}, {"shore_mt": 3.0, "mongodb": 1.5})
    coco = CoCo(services, groups, profile=prof, background_pids=background, slice_s=0.5)
    carry_out(node, coco.start(context(node, tasks=True)))
    assert coco._dropped == [] and coco._dedicated == {}
    node.observe()
    held = {"shore_mt": 0, "mongodb": 0}
    pids = {s.name: s.pids for s in services}
    for _ in range(60):
        node.advance(0.1)
        carry_out(node, coco.decide(node.observe(), context(node, tasks=True, time_s=node.now())))
        for name in held:
            held[name] += pids[name] <= node.tasks(groups[-1])
    assert held["mongodb"] > 0, "no starvation: both contenders get turns"
    assert held["shore_mt"] > held["mongodb"], "the higher slowdown holds the tier longer"
    assert held["shore_mt"] + held["mongodb"] == 60, "the contested tier is never idle"


def _turns(profile, slice_s: float, intervals: int = 60) -> list[tuple[str, int]]:
    """(holder, intervals held) of each turn of the top tier that mongodb and shore_mt
    time-share under ``profile``, in order."""
    node, services, background, groups = _setup()
    coco = CoCo(services, groups, profile=profile, background_pids=background, slice_s=slice_s)
    carry_out(node, coco.start(context(node, tasks=True)))
    node.observe()
    pids = {s.name: s.pids for s in services}
    holders = []
    for _ in range(intervals):
        node.advance(0.1)
        carry_out(node, coco.decide(node.observe(), context(node, tasks=True, time_s=node.now())))
        held = [n for n in ("mongodb", "shore_mt") if pids[n] <= node.tasks(groups[-1])]
        holders.append(held[0] if len(held) == 1 else None)
    return [(h, len(list(run))) for h, run in itertools.groupby(holders)]


def test_no_slice_is_shorter_than_its_warmup_factor_in_cache_warmups(monkeypatch):
    """Two services time-share the top tier with weighted slices of 0.13 and 0.07 s, but
    refilling the tier stalls each 0.05 s (a slow memory): with the default 10 refills
    per slice the queue's slices are stretched together, 1.0 and 0.5 s, the weights' 2:1
    kept."""
    import models.coco

    node, services, _, groups = _setup()
    caps = node.capabilities()
    lines = tier_shapes(caps, len(groups) - 1)[-1][0] * caps.l3.way_bytes / LINE_BYTES
    monkeypatch.setattr(models.coco, "REFILL_STALL_S", 0.05 / lines)
    prof = _needy_profile(services, {"mongodb", "shore_mt"}, {"shore_mt": 3.0, "mongodb": 1.5})
    turns = _turns(prof, slice_s=0.1)
    assert len(turns) >= 4 and None not in dict(turns), turns
    assert {n: t for n, t in turns[1:-1]} == {"shore_mt": 10, "mongodb": 5}, turns


def test_a_move_costs_the_refill_of_what_a_service_holds_not_of_the_tier():
    """Profiled, a service whose data fit holds a few MB of an 11-way tier: refilling them
    costs it milliseconds, and every slice is its weighted share. Filling the whole tier
    at its (low) steady miss rate, the warm-up came to seconds, and the services that
    suffer least held the tier longest."""
    node = SimNode("more_lc_than_closids_e5v3", 0, auto_groups=False)
    from models import catalogue
    from models.setup import Setup

    coco = catalogue.build("coco", Setup(node, node, 0.1))
    coco.start(context(node, tasks=True))
    tier, queue = coco._spare[0], coco._rotation
    assert len(queue) >= 3 and all(coco.profile[n].held_bytes > 0 for n in queue)
    total = sum(coco._weight(n) for n in queue)
    for n in queue:
        share = coco.slice_s * len(queue) * coco._weight(n) / total
        assert coco._slice_intervals(n, tier, queue) == math.ceil(share / 0.1 - 1e-9), n
    by_weight = sorted(queue, key=coco._weight)
    slices = [coco._slice_intervals(n, tier, queue) for n in by_weight]
    assert slices == sorted(slices) and slices[0] < slices[-1]


def test_weighted_round_robin_shares_spare_tiers_without_starvation():
    _node, services, _background, groups = _setup()
    weights = {"memcached_coco": 1.1, "nginx": 1.1, "mongodb": 1.1, "specjbb": 3.0, "shore_mt": 1.1}
    prof = {
        s.name: ServiceProfile(
            tails={1: 0.1 * s.slo.target_ms, 2: 0.1}, cpi={1: weights[s.name]}, cpi_full=1.0
        )
        for s in services
    }
    top = groups[-1]
    held: dict[str, int] = {}
    node2, services2, background2, groups2 = _setup()
    coco2 = CoCo(services2, groups2, profile=prof, background_pids=background2, slice_s=0.5)
    carry_out(node2, coco2.start(context(node2, tasks=True)))
    node2.observe()
    for _ in range(120):
        node2.advance(0.1)
        snap = node2.observe()
        carry_out(node2, coco2.decide(snap, context(node2, tasks=True, time_s=node2.now())))
        for s in services2:
            if s.pids <= node2.tasks(top):
                held[s.name] = held.get(s.name, 0) + 1
    assert coco2._dedicated == {}  # nobody needs the large tier: it is time-shared
    assert set(held) == {s.name for s in services2}  # every service gets a turn
    assert held["specjbb"] > max(v for k, v in held.items() if k != "specjbb")


@pytest.mark.parametrize("preset_scenario", [EPYC, "more_lc_than_closids_e5v3"])
def test_tier_shapes_move_cat_and_mba_together(preset_scenario):
    caps = SimNode(preset_scenario, auto_groups=False).capabilities()
    for k in (1, 2, 3):
        shapes = tier_shapes(caps, k)
        assert sum(w for w, _ in shapes) == caps.l3.num_ways
        lc = shapes[1:]
        assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in itertools.pairwise(lc))
        assert shapes[0] == (2, 0.10)


def test_coco_needs_its_groups():
    node, services, _background, groups = _setup()
    with pytest.raises(ValueError, match="do not exist"):
        CoCo(services, ["nope_bg", "nope_t1"]).start(context(node, tasks=True))
    with pytest.raises(ValueError, match="no services"):
        CoCo([], groups)


@pytest.mark.parametrize(
    ("needy", "before", "after"),
    [
        # a profile that wrongly says shore_mt is fine in the middle tier is corrected
        ({"shore_mt": 1.2}, {2: "shore_mt"}, {3: "shore_mt"}),
        # mongodb (the higher slowdown) takes the middle tier both need, shore_mt the
        # largest: over its SLO there it has nowhere higher to go and keeps it
        (
            {"shore_mt": 2.0, "mongodb": 3.0},
            {2: "mongodb", 3: "shore_mt"},
            {2: "mongodb", 3: "shore_mt"},
        ),
    ],
)
def test_dedicated_service_over_its_slo_moves_up_a_tier(needy, before, after):
    """Online refinement on a 16-CLOS part (three LC tiers), from the observed tail."""
    from agent.sim import get_scenario

    scn = get_scenario(EPYC).with_machine("e5_2683v4")
    node = SimNode(scn, seed=2, noise=False, auto_groups=False)
    wl = node.workloads()
    services = [
        # shore_mt's SLO is set far below what any tier gives it (0.2 ms): it always misses
        Service(w.name, frozenset(w.pids), SLO(w.slo.percentile, 0.2))
        if w.name == "shore_mt"
        else Service(w.name, frozenset(w.pids), w.slo)
        for w in wl
        if w.kind == "lc"
    ]
    groups = prepare_groups(node, services[0].slo)
    assert len(groups) == 4  # background + three LC tiers
    prof = {
        s.name: ServiceProfile(
            tails={1: 10.0 * s.slo.target_ms, 2: 0.01, 3: 0.01}
            if s.name in needy
            else {1: 0.01, 2: 0.01, 3: 0.01},
            cpi={1: needy.get(s.name, 1.2)},
            cpi_full=1.0,
        )
        for s in services
    }
    coco = CoCo(services, groups, profile=prof, patience=3)
    carry_out(node, coco.start(context(node, tasks=True)))
    assert coco._dedicated == before
    node.observe()
    for _ in range(20):
        node.advance(0.1)
        snap = node.observe()
        carry_out(node, coco.decide(snap, context(node, tasks=True, time_s=node.now())))
    assert coco._dedicated == after and coco._dropped == []
    pids = {s.name: s.pids for s in services}
    for j, name in after.items():
        assert pids[name] <= node.tasks(groups[j])


EXITED = 999_999  # a pid the node has no task for: one of the service's tasks has exited


@pytest.mark.parametrize("make", [CoCo, RoundRobin])
@pytest.mark.parametrize("start_refused", [False, True], ids=["start_carried", "start_refused"])
def test_a_task_that_exited_neither_keeps_its_service_out_nor_is_sent_again(
    make, start_refused, monkeypatch
):
    """A service whose configured pids name a task that has exited: its live tasks are
    placed, and the exited pid is sent again at most once after the node refused it. A
    start whose moves were all refused (nothing listed) is no proof of exit: the service's
    tasks are tried again."""
    node, services, background, groups = _setup()
    services[0] = dataclasses.replace(services[0], pids=services[0].pids | {EXITED})
    ctrl = make(services, groups, background_pids=background)
    if start_refused:
        real_start = ctrl.start
        monkeypatch.setattr(ctrl, "start", lambda ctx: (real_start(ctx), KEEP)[1])
    records = drive(ctrl, node, node, 20)
    sent = [any(EXITED in p for p in r.decision.moves.values()) for r in records]
    assert sent == [start_refused] + [False] * 19
    for s in services:
        assert s.pids - {EXITED} <= node.tasks(ctrl._placed[s.name]), s.name


@pytest.mark.parametrize("make", [CoCo, RoundRobin])
def test_a_service_whose_tasks_all_exited_takes_no_turns_until_one_is_placed_again(make):
    """Every task of a service has exited (the node refuses each of its pids): after a
    second try it leaves the schedule: its pids are not sent again and the tiers go to
    services that have tasks, the note naming it. Once one of its tasks is listed in a
    group again (placed by the tuner or an operator) it takes turns again."""
    node, services, background, groups = _setup()
    ghost, top = services[0], groups[-1]
    dead = True
    assign = node.assign

    def refusing(group, *, pids=(), cpus=()):
        gone = set(pids) & ghost.pids if dead else set()
        if gone:
            raise UnknownTask(min(gone))
        return assign(group, pids=pids, cpus=cpus)

    node.assign = refusing
    holders = []  # the services holding the top tier in each interval

    class Clock:
        def now(self) -> float:
            return node.now()

        def advance(self, dt: float) -> None:
            nonlocal dead
            holders.append({s.name for s in services if s.pids & node.tasks(top)})
            if len(holders) == 20:  # its tasks are back, and placed in the shared tier
                dead = False
                assign(groups[1], pids=sorted(ghost.pids))
            node.advance(dt)

    ctrl = make(services, groups, background_pids=background, slice_s=0.1)
    records = drive(ctrl, node, Clock(), 40)
    sent = [any(ghost.pids & p for p in r.decision.moves.values()) for r in records[:19]]
    assert sent == [True] + [False] * 18  # tried again once after the start
    assert "no live tasks, not scheduled: ['" + ghost.name in records[1].decision.note
    assert all(holders[2:20]), "a tier held by a service without tasks"
    assert any(ghost.name in h for h in holders[20:]), "back in the schedule"
    assert "no live tasks" not in records[-1].decision.note


def test_calibration_measures_a_service_by_the_tasks_it_has_left():
    node, services, background, groups = _setup()
    services[0] = dataclasses.replace(services[0], pids=services[0].pids | {EXITED})
    background = [*background, EXITED + 1]
    prof = calibrate(node, node, services, groups, background_pids=background, measure_intervals=2)
    assert set(prof) == {s.name for s in services}
    assert prof[services[0].name].cpi_full > 0 and prof[services[0].name].held_bytes > 0


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"name": "a", "pids": [1]}, "slo"),
        ({"name": "a", "pids": [], "slo": {"percentile": 99, "target_ms": 1}}, "no tasks"),
        ({"name": "a", "pids": [1], "slo": {"percentile": 98, "target_ms": 1}}, "percentile"),
    ],
)
def test_services_from_options_say_what_is_wrong(raw: dict, problem: str) -> None:
    from models.coco import services_from_options

    with pytest.raises(ValueError, match=r"services\[0\]") as err:
        services_from_options([raw])
    assert problem in str(err.value)


def test_catalogue_builds_coco_from_plain_options() -> None:
    """An operator's config: services as plain data, tier groups by name, no calibration
    when the profile is given."""
    from models import catalogue
    from models.catalogue import ControllerSpec
    from models.setup import Setup

    node = SimNode("default", 0)
    options = {
        "services": [{"name": "kv", "pids": [7], "slo": {"percentile": 99.0, "target_ms": 1.0}}],
        "groups": ["bg", "t1"],
        "profile": {},
    }
    coco = catalogue.build(ControllerSpec("coco", options), Setup(node))
    assert isinstance(coco, CoCo) and coco.services[0].pids == frozenset({7})
    assert coco.groups == ["bg", "t1"]


def test_a_counter_perf_could_not_schedule_is_left_out_of_the_profile(monkeypatch):
    """One interval whose instructions and cycles read NaN (a multiplexed PMC event, as
    perf reports it) is not measured: summed, it made the state's CPI NaN and the
    service's weight 1."""
    from agent.types import Snapshot

    def profiled(poison: int | None):
        node, services, background, groups = _setup()
        real, calls = node.observe, [0]

        def observe():
            snap = real()
            calls[0] += 1
            if calls[0] == poison:
                nan = {"instructions": math.nan, "cycles": math.nan}
                bad = {g: dataclasses.replace(s, **nan) for g, s in snap.groups.items()}
                snap = Snapshot(snap.timestamp, snap.interval_s, bad, snap.vanished)
            return snap

        monkeypatch.setattr(node, "observe", observe)
        return calibrate(node, node, services, groups, background_pids=background)

    clean, poisoned = profiled(None), profiled(15)  # within the first service's first state
    for name, p in poisoned.items():
        assert all(math.isfinite(c) for c in p.cpi.values()), name
        assert p.slowdown(1) == pytest.approx(clean[name].slowdown(1), rel=0.05), name


def test_round_robin_gives_fewer_services_than_higher_tiers_the_largest_ones():
    """One LC service and two higher tiers: it takes the largest. Placed in every higher
    tier in turn, it ended in the smaller, and the largest stayed empty."""
    node, services, background, groups = _setup("default")  # memcached on a Gold 6130
    assert len(services) == 1 and len(groups) >= 4  # background, shared, two higher
    rr = RoundRobin(services, groups, background_pids=background)
    carry_out(node, rr.start(context(node, tasks=True)))
    assert services[0].pids <= node.tasks(groups[-1])

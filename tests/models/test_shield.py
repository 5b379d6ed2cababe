"""The SLO shield (models/shield.py): its slack feedback on arrays, the decoder honouring
its floors whatever the action, and its purpose: random actions behind it keep SLOs about
as well as the best heuristic on feasible validation-split mixes, where the same random
actions without it do not."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agent.sim import LoadProfile, Scenario, SimNode, WorkloadInstance
from agent.sim.headroom import solo_max_utilization
from models.actions import ActionDecoder, check_levels, decode_arrays
from models.controller import context
from models.policy import RandomController
from models.shield import Shield, ShieldConfig, held_levels, held_shares
from tests.models.exports import copy_export

DEC = ActionDecoder(max_groups=4, share_levels=5, mba_levels=4)


def _layout(ways: int = 11, present: int = 4, mba: bool = True):
    caps = SimNode("default", 0).capabilities()
    lay = DEC.decode_layout(present, caps)
    lay.total[:] = ways
    if not mba:
        lay.mb_table[:] = np.nan
    return lay


def _shield(is_lc, held, ways=11, config=None):
    lay = _layout(ways, len(is_lc))
    sh = Shield(1, DEC.max_groups, config)
    lc = np.zeros((1, DEC.max_groups), dtype=bool)
    lc[0, : len(is_lc)] = is_lc
    h = np.zeros((1, DEC.max_groups), dtype=np.int64)
    h[0, : len(held)] = held
    sh.reset(np.array([0]), lc, lay, h, np.full((1, DEC.max_groups), np.nan))
    return sh, lay


def _row(values, fill=np.nan, dtype=float):
    out = np.full((1, DEC.max_groups), fill, dtype=dtype)
    out[0, : len(values)] = values
    return out


def _update(sh, ratio, held, mb_level=3, shared=(), misses=None, p50=None):
    requests = None if misses is None else (_row(misses), _row(p50))
    sh.update(
        np.array([0]),
        _row(ratio),
        _row(held, 0, np.int64),
        np.full((1, DEC.max_groups), mb_level),
        _row(shared, False, bool),
        requests,
    )


@pytest.mark.parametrize(("shared", "floor"), [(False, 3), (True, 4)])
def test_ample_slack_releases_a_way_only_of_a_partition_of_its_own(shared, floor) -> None:
    # A tail at 0.3 of its target measured while sharing every way (an unpartitioned node)
    # says nothing of an exclusive partition of its share's size: the floor holds there.
    sh, _ = _shield([True, False], [4, 7])
    _update(sh, [0.3, math.nan], [4, 7], mb_level=1, shared=[shared, shared])
    ways, mb = sh.floors()
    assert ways[0, 0] == floor
    assert mb[0, 0] == 0  # the MBA level is the group's own either way: it may lose one


def test_a_run_started_unpartitioned_keeps_the_lc_share_through_its_first_slack() -> None:
    # The policy controller's shield on a fresh node: every group shares all ways, so the
    # LC group's first interval of ample slack leaves its floor at the equal share.
    from models.shield import NodeShield

    node = SimNode("default", seed=0)
    ctx = context(node)
    slots = sorted(ctx.groups)
    shield = NodeShield(DEC.max_groups, ShieldConfig())
    lay = DEC.decode_layout(len(slots), ctx.capabilities)
    shield.start(slots, ctx.groups, ctx.capabilities, lay, ctx.allocation)
    start = shield.floors()[0].copy()
    ratio = np.full((1, DEC.max_groups), np.nan)
    lc = [i for i, g in enumerate(slots) if ctx.groups[g].slo is not None]
    ratio[0, lc] = 0.2
    shield.observe(ratio, ctx.allocation)
    assert start[0, lc].tolist() == shield.floors()[0][0, lc].tolist() != [0] * len(lc)


def test_starts_from_what_lc_groups_hold_fitted_to_the_cache() -> None:
    # unpartitioned on first sight: each LC group holds all 11 ways; two batch groups
    # must keep a way each, so the two LC floors share 9 (the larger, later one gives first)
    sh, _ = _shield([True, True, False, False], [11, 11, 11, 11])
    ways, mb = sh.floors()
    assert ways[0, :4].tolist() == [5, 4, 0, 0]
    assert mb[0, :2].tolist() == [3, 3]  # no MB value held: unthrottled, the top level


@pytest.mark.parametrize(
    ("ratio", "held", "floor"),
    [
        (0.95, 4, 6),  # pressure: what it holds plus 1 + floor((0.95 - 0.8) / 0.1)
        (0.81, 4, 5),
        (3.0, 4, 8),  # grows at most max_grow (4) ways at once
        (0.7, 4, 4),  # between low and high: holds what it has
        (math.nan, 4, 4),  # not measured (idle): holds
        (0.3, 4, 3),  # ample slack: may lose one way
        (0.3, 1, 1),  # never below the minimum slice
    ],
)
def test_feedback_on_tail_slack(ratio: float, held: int, floor: int) -> None:
    sh, _ = _shield([True, False], [2, 9])
    _update(sh, [ratio, math.nan], [held, 11 - held], mb_level=1)
    ways, mb = sh.floors()
    assert ways[0, :2].tolist() == [floor, 0]
    expect_mb = 3 if ratio > 0.8 else 0 if ratio < 0.5 else 1
    assert mb[0, 0] == expect_mb


@pytest.mark.parametrize("remember", [True, False])
def test_a_shrink_that_meets_pressure_is_not_repeated(remember: bool) -> None:
    # Walked down one way per interval of ample slack, the group falls over an edge at 2
    # ways (pressure right after the shrink from 3): 3 becomes its lowest floor for the
    # rest of the episode, however ample the slack later; without the memory it is walked
    # down again.
    sh, lay = _shield([True, False], [4, 7], config=ShieldConfig(remember=remember))
    floors = []
    for ratio, held in [(0.3, 4), (0.3, 3), (2.0, 2), (0.3, 6), (0.3, 5), (0.3, 4), (0.3, 3)]:
        _update(sh, [ratio, math.nan], [held, 11 - held])
        floors.append(int(sh.floors()[0][0, 0]))
    assert floors[:6] == [3, 2, 6, 5, 4, 3]
    assert floors[6] == (3 if remember else 2)
    sh.reset(np.array([0]), sh.is_lc[:1], lay, np.array([[3, 8, 0, 0]]), np.full((1, 4), np.nan))
    _update(sh, [0.3, math.nan], [3, 8])
    assert sh.floors()[0][0, 0] == 2  # a new episode forgets


def test_pressure_without_a_shrink_leaves_no_memory() -> None:
    # the load rose while the group kept its ways: no edge was found, the floor comes back down
    sh, _ = _shield([True, False], [3, 8])
    for ratio, held, want in [(2.0, 3, 7), (0.3, 7, 6), (0.3, 6, 5), (0.3, 3, 2)]:
        _update(sh, [ratio, math.nan], [held, 11 - held])
        assert sh.floors()[0][0, 0] == want


@pytest.mark.parametrize("give_up", [0, 3])
def test_futile_pressure_lapses_the_floor_then_retries(give_up: int) -> None:
    # The LC group's tail stays at twice its target: after give_up intervals in a row its
    # floor lapses to the minimum slice (its MBA floor with it) for `retry` intervals,
    # then the feedback takes it up again; give_up 0 keeps the floor up however long the
    # pressure lasts.
    config = ShieldConfig(give_up=give_up, retry=4)
    sh, _ = _shield([True, False], [6, 5], config=config)
    floors = []
    for _ in range(9):
        _update(sh, [2.0, math.nan], [6, 5])
        floors.append(int(sh.floors()[0][0, 0]))
    if give_up:
        assert floors == [10, 10, 1, 1, 1, 1, 10, 10, 1]
        assert sh.floors()[1][0, 0] == 0
    else:
        assert floors == [10] * 9
        assert sh.floors()[1][0, 0] == 3


@pytest.mark.parametrize("between", [0.9, math.nan])
def test_an_interval_within_target_restarts_the_count(between: float) -> None:
    # over, over, within (or not measured), over, over: never three in a row
    sh, _ = _shield([True, False], [6, 5], config=ShieldConfig(give_up=3))
    for ratio in [2.0, 2.0, between, 2.0, 2.0]:
        _update(sh, [ratio, math.nan], [6, 5])
        assert sh.floors()[0][0, 0] >= 6


def test_a_floor_held_in_the_band_is_probed_one_way_down() -> None:
    # probe 2: two intervals in a row between low and high release one way and pin the
    # slot; when pressure follows the probe, the remembered cliff puts the way back
    sh, _ = _shield([True, False], [6, 5], config=ShieldConfig(probe=2))
    levels = np.array([4, 4, 0, 0, 3, 3, 0, 0])
    seen = []
    for ratio, held in [(0.7, 6), (0.7, 6), (0.7, 5), (0.6, 5), (0.9, 4), (0.7, 9)]:
        _update(sh, [ratio, math.nan], [held, 11 - held])
        seen.append((int(sh.floors()[0][0, 0]), int(sh.pinned(levels)[0])))
    assert seen == [(6, 4), (5, 0), (5, 4), (4, 0), (5, 4), (9, 4)]
    assert sh.guard[0, 0] == 5  # the size before the probe that met pressure


def test_probe_counts_only_intervals_in_a_row_in_the_band() -> None:
    # ample slack, an interval without requests and pressure each restart the count
    sh, _ = _shield([True, False], [6, 5], config=ShieldConfig(probe=2))
    levels = np.full(8, 3)
    for ratio in [0.7, 0.3, 0.7, math.nan, 0.7, 0.9, 0.7]:
        _update(sh, [ratio, math.nan], [6, 5])
        assert sh.pinned(levels)[0] == 3
    _update(sh, [0.7, math.nan], [6, 5])
    assert sh.pinned(levels)[0] == 0 and sh.floors()[0][0, 0] == 5


@pytest.mark.parametrize(("misses", "probed"), [(500.0, True), (1500.0, False), (math.nan, False)])
def test_probe_share_probes_only_slots_whose_misses_are_a_small_part(misses, probed) -> None:
    # probe_share 0.1 at 100 ns a miss against a 1 ms median: 50 us of misses a request
    # is probed, 150 us (a store whose misses are much of its time) is not, nor a slot
    # whose misses are not measured
    config = ShieldConfig(probe=2, probe_share=0.1)
    sh, _ = _shield([True, False], [6, 5], config=config)
    for _ in range(2):
        _update(sh, [0.7, math.nan], [6, 5], misses=[misses, math.nan], p50=[1.0, math.nan])
    assert int(sh.floors()[0][0, 0]) == (5 if probed else 6)


@pytest.mark.parametrize(("misses", "guard"), [(100.0, 0), (5000.0, 4), (math.nan, 4)])
def test_an_edge_is_remembered_only_where_the_misses_can_show_one(misses, guard) -> None:
    # with probe_share 0.1: pressure right after a shrink arms the cliff memory unless
    # the group's misses at the smaller size are still under a tenth of its fastest
    # median (10 us against 1 ms: the pressure came with the load, not the shrink)
    config = ShieldConfig(probe_share=0.1)
    sh, _ = _shield([True, False], [4, 7], config=config)
    for ratio, held in [(0.3, 4), (2.0, 3)]:
        _update(sh, [ratio, math.nan], [held, 11 - held], misses=[misses, math.nan],
                p50=[1.0, math.nan])  # fmt: skip
    assert sh.guard[0, 0] == guard


@pytest.mark.parametrize(
    ("misses", "p50", "released"),
    [
        ([50.0], [1.0], True),  # 5 us of misses per request against a 1 ms median
        ([150.0], [1.0], False),  # 15 us: more than 1%
        ([150.0, 150.0], [1.0, 10.0], [False, False]),  # the fastest median, not the latest
        ([math.nan], [1.0], False),  # misses not measured
    ],
)
def test_a_slot_whose_misses_cannot_matter_is_let_go(misses, p50, released) -> None:
    # miss_share 0.01 at 100 ns a miss: released (one way down and pinned) while the
    # misses of a request cost less than 1% of the fastest median latency of the run;
    # pressure then grows nothing and is not counted towards the lapse
    config = ShieldConfig(miss_share=0.01, give_up=1)
    sh, _ = _shield([True, False], [6, 5], config=config)
    want = released if isinstance(released, list) else [released]
    for m, median, rel in zip(misses, p50, want, strict=True):
        _update(sh, [1.5, math.nan], [6, 5], misses=[m, math.nan], p50=[median, math.nan])
        assert bool(sh._released[0, 0]) is rel
        assert int(sh.floors()[0][0, 0]) == (5 if rel else 1)  # else: lapsed (give_up 1)
        assert int(sh.pinned(np.full(8, 3))[0]) == (0 if rel else 3)


def test_decoded_lc_ways_never_fall_below_the_floor() -> None:
    sh, lay = _shield([True, True, False, False], [3, 3, 3, 2])
    _update(sh, [1.2, 0.9, math.nan, math.nan], [3, 3, 3, 2])
    floor, mb_floor = sh.floors()
    assert floor[0, :2].sum() == 9  # 7 and 5 asked for, fitted: two batch ways stay
    rng = np.random.default_rng(0)
    levels = check_levels(DEC, rng.integers(0, DEC.nvec, size=(500, len(DEC.nvec))))
    n = len(levels)
    stack = type(lay).stack([lay] * n)
    d = decode_arrays(DEC, stack, levels, np.repeat(floor, n, 0), np.repeat(mb_floor, n, 0))
    assert (d.ways[:, :2] >= floor[0, :2]).all()
    assert (d.ways[:, :4] >= 1).all() and (d.ways[:, :4].sum(axis=1) == 11).all()
    masks = d.masks[:, :4]
    for row in masks:  # disjoint and contiguous, as without floors
        assert sum(int(m).bit_count() for m in row) == int(np.bitwise_or.reduce(row)).bit_count()
    lv = held_levels(d.mb[:, :2], stack.mb_table)
    assert (lv >= mb_floor[0, :2]).all()
    bare = decode_arrays(DEC, stack, levels)
    assert (bare.ways[:, 0] < floor[0, 0]).any()  # the floors are what keeps them up


def test_no_floors_where_groups_must_share_slices() -> None:
    sh, _ = _shield([True, False, False, False], [11, 11, 11, 11], ways=3)
    assert sh.floors()[0].sum() == 0


def test_config_checks() -> None:
    assert ShieldConfig.of(False) is None and ShieldConfig.of(None) is None
    assert ShieldConfig.of(True) == ShieldConfig()
    assert ShieldConfig.of({"high": 0.9}).high == 0.9
    with pytest.raises(ValueError, match="unknown shield options"):
        ShieldConfig.of({"hgih": 0.9})
    with pytest.raises(ValueError, match="low < high"):
        ShieldConfig(low=0.9, high=0.8)
    with pytest.raises(ValueError, match="remember"):
        ShieldConfig(remember=1)
    with pytest.raises(ValueError, match="give_up must be a non-negative integer"):
        ShieldConfig(give_up=-1)
    with pytest.raises(ValueError, match="retry must be a positive integer"):
        ShieldConfig(retry=0)
    with pytest.raises(ValueError, match="pin must be true or false"):
        ShieldConfig(pin=1)
    with pytest.raises(ValueError, match="probe must be a non-negative integer"):
        ShieldConfig(probe=1.5)
    assert not ShieldConfig(probe=2).reads_misses  # the probe alone reads tails only
    assert ShieldConfig(probe_share=0.1).reads_misses and ShieldConfig(miss_share=0.01).reads_misses
    for bad in (-0.1, math.inf, math.nan, True):
        with pytest.raises(ValueError, match="miss_share must be a non-negative number"):
            ShieldConfig(miss_share=bad)


@pytest.mark.parametrize(("pin", "give_up", "pinned"), [(True, 2, True), (False, 2, False),
                                                        (True, 0, False)])  # fmt: skip
def test_pinned_zeroes_the_share_levels_of_lapsed_slots_only(pin, give_up, pinned) -> None:
    config = ShieldConfig(give_up=max(give_up, 2), pin=pin)
    sh, _ = _shield([True, True, False], [4, 4, 3], config=config)
    for _ in range(2):  # the first slot over its target twice in a row: it lapses
        _update(sh, [1.5, 0.7, math.nan], [4, 4, 3])
    if give_up == 0:  # a config without the lapse never pins
        sh.config = ShieldConfig(give_up=0, pin=pin)
    levels = np.array([4, 3, 2, 1, 0, 0, 0, 0, 3, 3, 3, 3, 0, 0, 0, 0])
    out = sh.pinned(levels)
    assert out[0] == (0 if pinned else 4)
    assert out[1:].tolist() == levels[1:].tolist()  # other slots and every MBA level kept
    assert sh.pinned(levels[None, :])[0].tolist() == out.tolist()  # one node or N alike


def test_a_pinned_lost_cause_holds_the_minimum_slice() -> None:
    # specjbb on one thread at 85% load misses its target whatever it holds (2.4x at 12 of
    # 20 ways). Behind a shield that pins lapsed slots, random actions leave it the minimum
    # slice once it has lapsed; without the pin they size it at random.
    lost = Scenario(
        "lost",
        "e5_2683v4",
        (
            WorkloadInstance("svc", "specjbb", threads=1,
                             load=LoadProfile("constant", 0.85, "utilization")),
            WorkloadInstance("ws", "water_spatial", threads=4),
            WorkloadInstance("sw", "swaptions", threads=4),
        ),
    )  # fmt: skip

    def held_while_lapsed(pin: bool) -> list[int]:
        node = SimNode(lost, 0, interval_s=0.1)
        ctrl = RandomController(seed=1, shield={"give_up": 2, "retry": 100, "pin": pin})
        assert ctrl.start(context(node)).plan is None  # keeps what the node holds
        node.observe()
        held = []
        for _ in range(20):
            node.advance(1.0)
            node.apply(ctrl.decide(node.observe(), context(node)).plan)
            if ctrl._shield.shield._lapsed[0, ctrl._slots.index("svc")] > 0:
                held.append(node.allocation().get("svc", 0).l3_mask.bit_count())
        return held

    least = SimNode(lost, 0).capabilities().l3.min_cbm_bits
    pinned, free = held_while_lapsed(True), held_while_lapsed(False)
    assert len(pinned) >= 15 and set(pinned) == {least}
    assert len(free) >= 15 and max(free) > 4 * least


def test_random_controller_behind_the_shield_keeps_lc_at_its_floor() -> None:
    node = SimNode("default", 3, interval_s=0.1)
    ctrl = RandomController(seed=1, share_levels=5, mba_levels=4)
    start = ctrl.start(context(node))
    assert start.plan is None  # keeps what the node holds (unpartitioned on first sight)
    node.observe()
    for _ in range(20):
        node.advance(1.0)
        snap = node.observe()
        floors = ctrl._shield.floors()[0][0]  # before this interval's feedback
        decision = ctrl.decide(snap, context(node))
        node.apply(decision.plan)
        held = ctrl._shield.floors()[0][0]
        alloc = node.allocation()
        for i, g in enumerate(ctrl._slots):
            ways = alloc.get(g, 0).l3_mask.bit_count()
            assert ways >= held[i], (g, ways, held[i], floors[i])


# Feasible validation-split mixes (eval/feasibility.py) where random actions without the
# shield miss SLO windows: seeded draws of the generator (eval/suites.py's held_out).
_MIXES = [
    ("gold6130", 4002, "random-195777916"),
    ("gold6130", 4002, "random-2024528503"),
    ("epyc7302p", 4002, "random-306064963"),
]


def test_random_actions_behind_the_shield_keep_slos_like_the_best_heuristic() -> None:
    from eval.feasibility import check_run
    from eval.runner import Job, run_job
    from eval.suites import held_out

    rates: dict[str, list[float]] = {"random": [], "random[shield=false]": [], "ubik": []}
    for preset, seed, name in _MIXES:
        drawn = held_out("validation", 6, seed, preset=preset, min_lc=1, max_lc=2, max_workloads=5)
        scn = next(s for s in drawn if s.name == name)
        assert check_run(scn, 0, 30, 1.0).label == "feasible"
        for spec, out in rates.items():
            res = run_job(Job("shield", scn, spec, 0, 30, 1.0))
            assert not res.error, res.error
            out.append(res.metrics["slo_violation_rate"])
    shielded, bare, ubik = (float(np.mean(v)) for v in rates.values())
    assert shielded <= ubik + 0.02, rates  # near the best heuristic (within 2 points)
    assert bare >= shielded + 0.05, rates  # without the shield the same actions miss SLOs


def _lost_cause() -> Scenario:
    """xapian at 1.3x the most it serves within its SLO alone, beside three cache-hungry
    batch jobs on the Gold 6130: no allocation meets its SLO (the random mixes never ask
    this much of a service, agent/sim/mixes.py)."""
    top = solo_max_utilization("xapian", "gold6130")
    load = LoadProfile("constant", 1.3 * top, "utilization")
    batch = ("water_spatial", "raytrace", "water_nsquared")
    return Scenario(
        "lost-cause",
        "gold6130",
        (WorkloadInstance("xapian", "xapian", load=load), *(WorkloadInstance(b, b) for b in batch)),
    )


def _drawn(name: str) -> Scenario:
    from eval.suites import held_out

    drawn = held_out("validation", 6, 4002, preset="gold6130", min_lc=1, max_lc=2, max_workloads=5)
    return next(s for s in drawn if s.name == name)


@pytest.mark.parametrize(
    ("mix", "label"),
    [("lost cause", "infeasible"), ("random-195777916", "feasible")],
)
def test_the_lapse_frees_a_lost_cause_and_nothing_else(tmp_path, mix: str, label: str) -> None:
    # The shipped policy behind the lapse its card names, against a copy without it:
    # on a mix no allocation can meet, the batch jobs get back what the floors held, with
    # the same violations; on a feasible mix the lapse never fires and nothing changes.
    from eval.feasibility import check_run
    from eval.runner import Job, run_job
    from models.card import ModelCard
    from models.policy import DEFAULT_POLICY

    runtime = ModelCard.read(DEFAULT_POLICY).runtime_shield()
    assert ShieldConfig.of(runtime).give_up > 0
    scn = _lost_cause() if mix == "lost cause" else _drawn(mix)
    assert check_run(scn, 0, 30, 1.0).label == label
    # the lapse alone: the release of floors that protect nothing would free a lost
    # search service's ways by itself (the next test)
    lapse = {**runtime, "probe": 0, "miss_share": 0}
    metrics = []
    for name, shield in (("plain", {**lapse, "give_up": 0}), ("lapse", lapse)):
        export = copy_export(DEFAULT_POLICY, tmp_path / name, **{"runtime.shield": shield})
        res = run_job(Job("lapse", scn, f"policy:{export}", 0, 30, 1.0))
        assert not res.error, res.error
        metrics.append(res.metrics)
    plain, lapse = metrics
    assert lapse["slo_violation_rate"] == plain["slo_violation_rate"]
    if label == "infeasible":
        assert lapse["weighted_speedup"] > plain["weighted_speedup"] + 0.1, (plain, lapse)
    else:
        assert lapse["weighted_speedup"] == plain["weighted_speedup"]


def _search_beside_a_database() -> Scenario:
    """A search leaf whose tail follows its bursts, not its cache, and an I/O-bound
    database, beside two batch jobs on the Gold 6130: a draw of the validation split
    (eval/data/suites.yaml, validation_large) on which no controller misses a window."""
    from eval.suites import held_out

    drawn = held_out("validation", 8, 3103, preset="gold6130", min_lc=1, max_lc=3, max_workloads=6)
    return next(s for s in drawn if s.name == "random-1259579044")


def test_floors_that_protect_nothing_are_let_go(tmp_path) -> None:
    # The shipped policy behind its training shield and the lapse gives the search leaf
    # and the database most of the cache: their floors hold what they were once given
    # while their tails sit between the thresholds. Probing those floors down gives the
    # batch jobs ways back; letting the database go at once (its misses are 0.1% of a
    # request's time) gives more. No SLO window is missed in any of the three.
    from eval.runner import Job, run_job
    from models.card import ModelCard
    from models.policy import DEFAULT_POLICY

    runtime = {**ModelCard.read(DEFAULT_POLICY).runtime_shield(), "probe": 0, "miss_share": 0}
    scn = _search_beside_a_database()
    ws = []
    for name, let_go in (("held", {}), ("probe", {"probe": 2}),
                         ("both", {"probe": 2, "miss_share": 0.01})):  # fmt: skip
        shield = {**runtime, **let_go}
        export = copy_export(DEFAULT_POLICY, tmp_path / name, **{"runtime.shield": shield})
        res = run_job(Job("let go", scn, f"policy:{export}", 0, 120, 1.0))
        assert not res.error, res.error
        assert res.metrics["slo_violation_rate"] == 0
        ws.append(res.metrics["weighted_speedup"])
    held, probed, both = ws
    assert probed > held + 0.05 and both > probed + 0.1, ws


def test_held_shares_count_shared_ways_as_a_share() -> None:
    present = np.array([[True, True, True, False]])
    unpartitioned = np.array([[0x7FF, 0x7FF, 0x7FF, 0]])
    assert held_shares(unpartitioned, present)[0].tolist() == [[3, 3, 3, 0]]
    assert held_shares(unpartitioned, present)[1].tolist() == [[True, True, True, False]]
    partitioned = np.array([[0b111, 0b11111000, 0x700, 0]])
    assert held_shares(partitioned, present)[0].tolist() == [[3, 5, 3, 0]]
    assert not held_shares(partitioned, present)[1].any()
    overlapping = np.array([[0b1111, 0b1100, 0x7F0, 0]])  # 0 and 1 share two ways
    assert held_shares(overlapping, present)[0].tolist() == [[2, 1, 7, 0]]
    assert held_shares(overlapping, present)[1].tolist() == [[True, True, False, False]]

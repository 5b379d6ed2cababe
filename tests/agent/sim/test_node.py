"""SimNode behaviour beyond the Node contract: determinism, dynamics, scenarios, truth."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from agent.errors import ResourceExhausted
from agent.sim import SimNode
from agent.sim.catalog import CatalogError, default_catalog, load_catalog
from agent.sim.model import Model
from agent.sim.scenario import (
    LoadProfile,
    Scenario,
    WorkloadInstance,
    get_scenario,
    read_trace,
    scenario_names,
)
from agent.types import (
    SLO,
    AllocationPlan,
    GroupAllocation,
    GroupKind,
    GroupSpec,
    contiguous_mask,
)


def trajectory(node: SimNode, steps: int = 20) -> list[tuple]:
    out = []
    for _ in range(steps):
        node.advance(node.interval_s)
        snap = node.observe()
        for name in sorted(snap.groups):
            g = snap.groups[name]
            lat = g.latency.p99_ms if g.latency is not None else None
            out.append((name, g.instructions, g.llc_misses, g.llc_occupancy_bytes, lat))
    return out


# ------------------------------------------------------------------ determinism


def test_same_seed_same_trajectory() -> None:
    assert trajectory(SimNode(seed=7)) == trajectory(SimNode(seed=7))


def test_different_seed_different_noise() -> None:
    assert trajectory(SimNode(seed=7)) != trajectory(SimNode(seed=8))


def test_reset_replays_the_same_trajectory() -> None:
    node = SimNode(seed=3)
    first = trajectory(node)
    node.reset(seed=3)
    assert node.now() == 0.0
    assert trajectory(node) == first


def test_reset_restores_groups_and_allocations() -> None:
    node = SimNode()
    groups = dict(node.groups())
    node.apply(AllocationPlan.uniform({"memcached": GroupAllocation(l3_mask=0x3)}))
    node.delete_group("swaptions")
    node.reset()
    assert dict(node.groups()) == groups
    assert node.allocation().get("memcached", 0).l3_mask == node.capabilities().l3.cbm_mask


def test_a_copy_continues_the_same_trajectory() -> None:
    """Pickled or deep-copied nodes (Ray workers, look-ahead) carry their RNG state."""
    import copy
    import pickle

    node = SimNode(seed=11)
    node.advance(1.0)
    node.observe()
    twin = pickle.loads(pickle.dumps(node))
    other = copy.deepcopy(node)
    expected = trajectory(node, 5)
    assert trajectory(twin, 5) == expected
    assert trajectory(other, 5) == expected


@pytest.mark.parametrize("scenario", ["default", "more_lc_than_closids_e5v3", "lc_bursty"])
def test_kept_pooled_latency_changes_no_observation(scenario: str, monkeypatch) -> None:
    """The engine keeps pooled latency quantiles by operating point; its key must hold
    everything they depend on (grouped services weigh by their requests, stalls by their
    share), so observations are the same bits with and without it."""
    from agent.sim import engine

    def run() -> tuple[list[str], int]:
        node = SimNode(scenario, seed=4)
        names = sorted(node.groups())
        out = []
        for i in range(120):
            if i == 60:  # a new operating point halfway
                node.apply(AllocationPlan.uniform({names[0]: GroupAllocation(l3_mask=0b11)}))
            node.advance(node.interval_s * (1 + i % 3))  # one step record or several
            out.append(repr(node.observe()))
        return out, len(node._engine._pooled_memo)

    kept, entries = run()
    assert entries > 0  # the memo was used
    monkeypatch.setattr(engine, "_POOLED_MEMO_SERVICES", 0)
    fresh, none = run()
    assert none == 0
    assert kept == fresh


def _with_arrivals() -> Scenario:
    """The default mix with a batch job arriving at 3 s and leaving at 7 s."""
    scn = get_scenario("default")
    last = dataclasses.replace(scn.workloads[-1], start_s=3.0, end_s=7.0)
    return dataclasses.replace(scn, workloads=(*scn.workloads[:-1], last))


@pytest.mark.parametrize(
    ("scenario", "seconds"),
    [("copart_memcached", 101.0), ("lc_bursty", 30.0), (_with_arrivals(), 10.0)],
    ids=["load_step_and_phases", "bursts", "arrivals"],
)
def test_quiet_refresh_window_changes_no_observation(scenario, seconds, monkeypatch) -> None:
    """A settled node skips the load, phase and activity lookups until the next time one
    of them can change; load steps, bursts, phases, arrivals and departures must still
    come at the same step, so observations are the same bits without the window."""
    from agent.sim.engine import Engine

    def run() -> tuple[list[str], bool]:
        node = SimNode(scenario, seed=2)
        out, quiet = [], False
        for i in range(round(seconds / 0.1)):
            node.advance(0.1)
            quiet |= node._engine._calm is not None
            if i % 5 == 4:
                out.append(repr(node.observe()))
        return out, quiet

    kept, used = run()
    assert used
    monkeypatch.setattr(Engine, "_calm_window", lambda self, tt, piecewise: None)
    fresh, unused = run()
    assert not unused
    assert kept == fresh


def test_noise_free_observation_matches_the_steady_state() -> None:
    node = SimNode(noise=False)
    node.advance(2.0)
    node.observe()
    node.advance(1.0)
    snap = node.observe()
    truth = node.steady_state()
    for name, sample in snap.groups.items():
        assert sample.instructions / snap.interval_s == pytest.approx(truth[name].ips, rel=1e-3)


def test_noisy_counters_stay_close_to_the_truth() -> None:
    node = SimNode(seed=1)
    node.advance(2.0)
    node.observe()
    truth = node.steady_state()
    node.advance(0.1)
    snap = node.observe()
    for name, sample in snap.groups.items():
        assert sample.instructions / snap.interval_s == pytest.approx(truth[name].ips, rel=0.05)
        assert sample.memory_bytes >= 0 and math.isfinite(sample.memory_bytes)


def test_steady_state_does_not_disturb_the_node() -> None:
    a, b = SimNode(seed=5), SimNode(seed=5)
    a.advance(1.0)
    b.advance(1.0)
    b.steady_state(AllocationPlan.uniform({"ocean_cp": GroupAllocation(l3_mask=0x1, mb=10)}))
    assert trajectory(a, 5) == trajectory(b, 5)
    assert a.allocation() == b.allocation()


# ------------------------------------------------------------------ dynamics


def test_load_step_shows_in_the_latency() -> None:
    """CoPart case study: memcached 75k -> 150k req/s at 99.4 s."""
    node = SimNode("copart_memcached", seed=2)
    node.advance(95.0)
    node.observe()
    node.advance(4.0)
    before = node.observe().groups["memcached"].latency
    node.advance(1.0)
    node.observe()
    node.advance(4.0)
    after = node.observe().groups["memcached"].latency
    assert after.count == pytest.approx(2 * before.count, rel=0.05)
    assert after.p95_ms > 2 * before.p95_ms


def test_future_load_is_the_load_the_node_will_have() -> None:
    """load_rps(name, at_s) reads the schedule realised at reset (bursts included)."""
    burst = LoadProfile("bursty", 0.3, "utilization", burst_factor=2.0, burst_s=0.5, gap_s=1.0)
    scn = Scenario("future", "gold6130", (WorkloadInstance("kv", "memcached", load=burst),))
    node = SimNode(scn, seed=4)
    times = [0.1 * k for k in range(1, 80)]
    ahead = [node.load_rps("kv", t) for t in times]
    seen = []
    for t in times:
        node.advance(t - node.now())
        seen.append(node.load_rps("kv"))
    assert ahead == seen
    assert len(set(seen)) == 2  # bursts happened in the window


def _inertia_node(machine: str = "gold6130") -> SimNode:
    """'fit' (cache-fitting, 1 thread) in way 0, a streaming group in every other way."""
    scn = Scenario(
        "inertia",
        machine,
        (
            WorkloadInstance("fit", "spec_t", threads=1),
            WorkloadInstance("stream", "spec_s", threads=4),
        ),
    )
    node = SimNode(scn, noise=False, interval_s=0.002)
    ways = node.preset.ways
    node.apply(
        AllocationPlan.uniform(
            {
                "fit": GroupAllocation(l3_mask=contiguous_mask(1)),
                "stream": GroupAllocation(l3_mask=contiguous_mask(ways - 1, 1)),
            }
        )
    )
    node.advance(0.5)
    return node


def _grow(node: SimNode) -> None:
    """'fit' gets ways 0-5, the streaming group keeps the rest."""
    ways = node.preset.ways
    node.apply(
        AllocationPlan.uniform(
            {
                "fit": GroupAllocation(l3_mask=contiguous_mask(6)),
                "stream": GroupAllocation(l3_mask=contiguous_mask(ways - 6, 6)),
            }
        )
    )


def test_occupancy_fills_gradually_after_a_mask_grows() -> None:
    node = _inertia_node()
    small = node.occupancy()["fit"].sum()
    assert small <= node.preset.way_bytes
    _grow(node)
    series = []
    for _ in range(20):
        node.advance(0.002)
        series.append(node.occupancy()["fit"].sum())
    final = node.steady_state()["fit"].occupancy_bytes
    assert final > 3 * small
    assert series[0] < small + 0.5 * (final - small), "occupancy jumped with the mask"
    assert np.all(np.diff(series) >= -1.0), "filling is monotone"
    assert series[-1] > small + 0.9 * (final - small), "and converges"


def test_lines_outside_a_shrunk_mask_stay_until_others_evict_them() -> None:
    """Inclusive LLC (Broadwell-EP): stale lines stay, and hit, until others insert there."""
    node = _inertia_node("e5_2683v4")
    _grow(node)
    node.advance(0.5)
    held = node.occupancy()["fit"]
    # Shrink to way 0: nobody inserts into ways 1-5, so those lines stay (and still hit).
    node.apply(AllocationPlan.uniform({"fit": GroupAllocation(l3_mask=contiguous_mask(1))}))
    node.advance(0.5)
    kept = node.occupancy()["fit"]
    assert kept[1:6].sum() == pytest.approx(held[1:6].sum(), rel=0.02)
    # Now the streaming group's mask covers ways 1-5: its inserts evict them over time.
    node.apply(AllocationPlan.uniform({"stream": GroupAllocation(l3_mask=contiguous_mask(19, 1))}))
    node.advance(0.002)
    partly = node.occupancy()["fit"][1:6].sum()
    node.advance(0.5)
    gone = node.occupancy()["fit"][1:6].sum()
    assert gone < 0.05 * held[1:6].sum() < partly


def test_non_inclusive_llc_migrates_stale_lines_into_the_mask() -> None:
    """Non-inclusive LLC (Skylake-SP): a hit line moves to L2 and re-enters the LLC
    through the current mask, so lines outside a shrunk mask leave even when nobody else
    inserts there, at the workload's hit rate."""
    node = _inertia_node("gold6130")
    _grow(node)
    node.advance(0.5)
    held = node.occupancy()["fit"][1:6].sum()
    node.apply(AllocationPlan.uniform({"fit": GroupAllocation(l3_mask=contiguous_mask(1))}))
    node.advance(0.002)
    partly = node.occupancy()["fit"][1:6].sum()
    node.advance(0.2)
    gone = node.occupancy()["fit"][1:6].sum()
    assert gone < 0.01 * held < partly
    truth = node.steady_state()["fit"]
    assert node.occupancy()["fit"].sum() == pytest.approx(truth.occupancy_bytes, rel=0.02)


def test_shared_ways_split_by_insertion_rate() -> None:
    scn = Scenario(
        "split",
        "gold6130",
        (WorkloadInstance("a", "spec_s", threads=1), WorkloadInstance("b", "spec_s", threads=3)),
    )
    node = SimNode(scn, noise=False)
    truth = node.steady_state()
    a, b = truth["a"].workloads["a"], truth["b"].workloads["b"]
    ratio = a.occupancy_bytes / b.occupancy_bytes
    assert ratio == pytest.approx(a.llc_misses_per_s / b.llc_misses_per_s, rel=0.02)


def test_squeezed_neighbours_slow_a_class_given_more_cache() -> None:
    """Bandwidth contention: with a flat miss curve, more ways for a streaming class
    while its cache-hungry neighbours get fewer makes it *slower* (docs/SIMULATOR.md,
    "Equations", 5)."""
    scn = Scenario(
        "more-cache",
        "gold6130",
        (WorkloadInstance("s", "spec_s"), *[WorkloadInstance(f"cg{i}", "CG") for i in range(3)]),
    )
    node = SimNode(scn, noise=False)

    def slowdown(ways: int) -> tuple[float, float]:
        rest = contiguous_mask(11 - ways, ways)
        plan = {"s": GroupAllocation(l3_mask=contiguous_mask(ways))}
        plan.update({f"cg{i}": GroupAllocation(l3_mask=rest) for i in range(3)})
        truth = node.steady_state(AllocationPlan.uniform(plan))
        return truth["s"].slowdown, truth["s"].memory_latency_ns

    (s4, lat4), (s8, lat8) = slowdown(4), slowdown(8)
    assert lat8 > lat4 * 1.05
    assert s8 > s4


def test_memory_latency_follows_the_loaded_latency_curve() -> None:
    """Mild below the peak (MLC: +21% at half of it, +51% at 97%), unbounded at it."""
    preset = default_catalog().machine("gold6130")
    model = Model([preset], [[default_catalog().workload("CG")]], [[4]])
    lat = [float(model.latency(np.array([u]))[0]) for u in (0.02, 0.5, 0.97, 0.999)]
    assert lat[1] == pytest.approx(1.21 * lat[0], rel=0.05)
    assert lat[2] == pytest.approx(1.51 * lat[0], rel=0.08)
    assert lat[3] > 2.5 * lat[0]
    # And the solved operating point never exceeds the peak bandwidth.
    node = SimNode(
        Scenario("s", "gold6130", tuple(WorkloadInstance(f"s{i}", "stream") for i in range(4))),
        noise=False,
    )
    total = sum(t.bandwidth_bps for t in node.steady_state().values())
    assert total < node.preset.peak_bw_bps


def test_mba_costs_cache_friendly_classes_a_little() -> None:
    node = SimNode(
        Scenario("wn", "gold6130", (WorkloadInstance("wn", "water_nsquared"),)), noise=False
    )
    slow = node.steady_state(AllocationPlan.uniform({"wn": GroupAllocation(mb=10)}))
    assert 1.01 < slow["wn"].slowdown < 1.15


def test_mba_coarse_steps_apply_as_90() -> None:
    """Gold 6130 preset: 70 and 80 behave as 90 (docs/RESCTRL.md, "Schemata")."""
    node = SimNode(Scenario("oc", "gold6130", (WorkloadInstance("oc", "ocean_cp"),)), noise=False)
    s = {
        mb: node.steady_state(AllocationPlan.uniform({"oc": GroupAllocation(mb=mb)}))["oc"].slowdown
        for mb in (60, 70, 80, 90)
    }
    assert s[70] == s[80] == s[90] < s[60]


def test_mba_throughput_depends_on_core_count() -> None:
    """Intel MBA is a per-core request limit: more cores, more bandwidth at one level."""
    bw = {}
    for threads in (1, 3):
        scn = Scenario("st", "gold6130", (WorkloadInstance("s", "stream", threads=threads),))
        node = SimNode(scn, noise=False)
        bw[threads] = node.steady_state(AllocationPlan.uniform({"s": GroupAllocation(mb=10)}))[
            "s"
        ].bandwidth_bps
    assert bw[3] > 2.5 * bw[1]


def test_amd_mb_value_caps_bandwidth() -> None:
    scn = Scenario("amd", "epyc7302p", (WorkloadInstance("s", "stream", threads=8),))
    node = SimNode(scn, noise=False)
    free = node.steady_state()["s"].bandwidth_bps
    capped = node.steady_state(AllocationPlan.uniform({"s": GroupAllocation(mb=80)}))["s"]
    assert capped.bandwidth_bps <= 80 * 0.125e9 * 1.01
    assert capped.bandwidth_bps < 0.5 * free


def test_batch_phases_change_throughput() -> None:
    scn = Scenario("ph", "gold6130", (WorkloadInstance("wc", "spark_wordcount"),))
    node = SimNode(scn, noise=False)
    node.advance(5.0)
    node.observe()
    node.advance(1.0)
    map_ips = node.observe().groups["wc"].instructions
    node.advance(40.0)
    node.observe()
    node.advance(1.0)
    reduce_ips = node.observe().groups["wc"].instructions
    assert reduce_ips < 0.95 * map_ips


def test_batch_arrivals_and_departures() -> None:
    """lc_diurnal's batch job CG arrives at 60 s and leaves at 300 s; the same times scaled
    down here (the physics does not depend on them)."""
    base = get_scenario("lc_diurnal")
    ws = tuple(
        dataclasses.replace(w, start_s=2.0, end_s=4.0) if w.name == "CG" else w
        for w in base.workloads
    )
    node = SimNode(dataclasses.replace(base, workloads=ws), noise=False)
    node.advance(1.0)
    node.observe()
    node.advance(0.5)
    assert node.observe().groups["CG"].instructions == 0.0
    node.advance(1.0)
    node.observe()
    node.advance(0.5)
    assert node.observe().groups["CG"].instructions > 0.0
    node.advance(1.5)
    node.observe()
    node.advance(0.5)
    assert node.observe().groups["CG"].instructions == 0.0


def test_moving_tasks_moves_performance_and_counters() -> None:
    """CoCo-style time sharing: an LC service moved into a 1-way group slows down, and its
    counters and latency follow its tasks."""
    node = SimNode(noise=False)
    node.create_group(GroupSpec("squeezed"))
    node.apply(AllocationPlan.uniform({"squeezed": GroupAllocation(l3_mask=0x1, mb=10)}))
    before = node.steady_state()["memcached"].workloads["memcached"].slowdown
    pids = next(w.pids for w in node.workloads() if w.name == "memcached")
    node.assign("squeezed", pids=pids)
    truth = node.steady_state()
    assert truth["squeezed"].workloads["memcached"].slowdown > before
    node.advance(0.5)
    snap = node.observe()
    assert snap.groups["memcached"].instructions == 0.0
    assert snap.groups["squeezed"].latency.count > 0


# ------------------------------------------------------------------ groups


def test_auto_groups_follow_the_scenario() -> None:
    node = SimNode()
    groups = node.groups()
    assert groups["memcached"].kind is GroupKind.LC
    assert groups["memcached"].slo.percentile == 95.0
    assert groups["ocean_cp"].kind is GroupKind.BATCH
    for w in node.workloads():
        assert node.tasks(w.name) == frozenset(w.pids)


def test_more_lc_services_than_closids() -> None:
    node = SimNode("more_lc_than_closids_e5v3")
    assert len(node.groups()) == node.capabilities().num_closids - 1 == 3
    in_default = [w for w in node.workloads() if w.group == ""]
    assert any(w.kind == "lc" for w in in_default)
    with pytest.raises(ResourceExhausted, match="Out of CLOSIDs"):
        node.create_group(GroupSpec("one_more"))


def test_exclusive_groups_take_free_ways_and_keep_them() -> None:
    from agent.errors import InvalidAllocation

    node = SimNode(Scenario("x", "gold6130", (WorkloadInstance("a", "CG"),)), auto_groups=False)
    node.create_group(GroupSpec("shared"))
    node.apply(AllocationPlan.uniform({"shared": GroupAllocation(l3_mask=0x7F)}))
    node.create_group(GroupSpec("mine", exclusive=True))
    assert node.allocation().get("mine", 0).l3_mask == 0x780
    with pytest.raises(InvalidAllocation) as err:
        node.apply(AllocationPlan.uniform({"shared": GroupAllocation(l3_mask=0xFF)}))
    assert err.value.rule == "exclusive_overlap"
    node.create_group(GroupSpec("later"))  # a new group gets every way not held exclusively
    assert node.allocation().get("later", 0).l3_mask == 0x7F
    node.delete_group("later")
    node.delete_group("shared")
    node.apply(AllocationPlan.uniform({"mine": GroupAllocation(l3_mask=0x7FF)}))
    with pytest.raises(ResourceExhausted, match="no free ways"):
        node.create_group(GroupSpec("none_left"))


def test_lc_workers_never_exceed_threads() -> None:
    scn = Scenario("w", "gold6130", (WorkloadInstance("kv", "memcached", threads=2),))
    small = SimNode(scn).workloads()[0]
    full = SimNode(Scenario("w", "gold6130", (WorkloadInstance("kv", "memcached"),))).workloads()[0]
    assert (small.lc_workers, full.lc_workers) == (2, 4)
    # Half the workers, half the capacity (within the few percent that two threads' lower
    # memory traffic takes off their CPI).
    assert small.lc_capacity_rps == pytest.approx(full.lc_capacity_rps / 2, rel=0.03)


def test_latency_reported_for_lc_groups_only() -> None:
    node = SimNode()
    node.advance(0.5)
    snap = node.observe()
    assert snap.groups["memcached"].latency.count > 0
    assert snap.groups["memcached"].latency.p999_ms >= snap.groups["memcached"].latency.p50_ms
    assert snap.groups["ocean_cp"].latency is None


def test_latency_follows_an_lc_service_into_another_group() -> None:
    # Which groups report latency is kept per topology: moving the service's tasks (a new
    # topology) moves its latency, and a new LC group with no service reports an idle one.
    node = SimNode(seed=2)
    node.advance(0.2)
    assert node.observe().groups["memcached"].latency.count > 0
    node.create_group(GroupSpec("moved", kind=GroupKind.LC, slo=SLO(99.0, 5.0)))
    node.advance(0.2)
    assert node.observe().groups["moved"].latency.count == 0
    node.assign("moved", pids=node.tasks("memcached"))
    node.advance(0.2)
    snap = node.observe()
    assert snap.groups["moved"].latency.count > 0
    assert snap.groups["memcached"].latency.count == 0  # an LC group: idle, not absent


def test_request_counts_follow_the_offered_load() -> None:
    node = SimNode("copart_memcached", seed=4)
    node.advance(1.0)
    lat = node.observe().groups["memcached"].latency
    assert lat.count == pytest.approx(75_000, rel=0.02)


def test_overload_grows_the_backlog_across_intervals() -> None:
    scn = Scenario(
        "over",
        "gold6130",
        (WorkloadInstance("m", "masstree", load=LoadProfile("constant", 1.3, "utilization")),),
    )
    node = SimNode(scn, seed=1)
    p50 = []
    for _ in range(5):
        node.advance(0.5)
        p50.append(node.observe().groups["m"].latency.p50_ms)
    assert all(b > a for a, b in itertools.pairwise(p50))


# ------------------------------------------------------------------ scenarios and catalog


@pytest.mark.parametrize("name", scenario_names())
def test_every_library_scenario_runs(name: str) -> None:
    node = SimNode(name, seed=0)
    node.advance(0.3)
    snap = node.observe()
    assert snap.groups
    for g in snap.groups.values():
        assert g.instructions >= 0 and math.isfinite(g.instructions)


def test_copart_mix_families_exist() -> None:
    names = set(scenario_names())
    for fam in ("h_llc", "h_bw", "h_both", "m_llc", "m_bw", "m_both", "is"):
        assert f"copart_{fam}" in names
    assert {"lc_batch_20", "lc_batch_60", "copart_memcached", "default"} <= names


def test_trace_load(tmp_path) -> None:
    trace = tmp_path / "load.csv"
    trace.write_text("time,rate\n0,1000\n1,3000\n")
    times, rates = read_trace(trace)
    assert times == (0.0, 1.0) and rates == (1000.0, 3000.0)
    scn_file = tmp_path / "traced.yaml"
    scn_file.write_text(
        "machine: gold6130\nworkloads:\n"
        "  - {workload: masstree, load: {kind: trace, file: load.csv}}\n"
    )
    node = SimNode(str(scn_file), seed=0)
    assert node.load_rps("masstree") == 1000.0
    node.advance(1.5)
    assert node.load_rps("masstree") == 3000.0


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("0,10\n1,abc\n", "line 2|:2:"),
        ("0,10\n0,20\n", "increase"),
        ("0,-5\n", "rate >= 0"),
        ("0\n", "time,rate"),
        ("", "no 'time,rate' rows"),
    ],
)
def test_corrupt_trace_is_a_clear_error(tmp_path, text: str, match: str) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text(text)
    with pytest.raises(CatalogError, match=match):
        read_trace(trace)


def test_missing_trace_file_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(CatalogError, match="cannot read load trace"):
        read_trace(tmp_path / "nope.csv")


def test_user_catalog_adds_workloads(tmp_path) -> None:
    extra = tmp_path / "mine.yaml"
    extra.write_text(
        "workloads:\n  my_job:\n    source: me\n    threads: 2\n    cpi_base: 1.0\n"
        "    apki: 5\n    mlp: 2\n    footprint_mb: 8\n    mrc: {floor: 0.1, ceil: 0.5}\n"
    )
    cat = load_catalog([extra])
    assert "my_job" in cat.workloads and "CG" in cat.workloads
    scn = Scenario("mine", "gold6130", (WorkloadInstance("j", "my_job"),), catalog=cat)
    node = SimNode(scn, noise=False)
    assert node.steady_state()["j"].ips > 0


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ("  bad:\n    threads: 1\n", "cite its source"),
        ("  bad:\n    source: x\n    threads: 1\n", "missing field"),
        (
            "  bad:\n    source: x\n    threads: 1\n    cpi_base: 1\n    apki: 1\n    mlp: 1\n"
            "    footprint_mb: 1\n    mrc: {floor: 0.5, ceil: 0.2}\n",
            "floor <= ceil",
        ),
        (
            "  bad:\n    source: x\n    threads: 1\n    cpi_base: 1\n    apki: 1\n    mlp: 1\n"
            "    footprint_mb: 1\n    mrc: {floor: 0.1, ceil: 0.2}\n    kind: lc\n"
            "    lc: {instructions_per_request: 100, workers: 1, stall: {ms: 5, per_request: 2}}\n",
            "stalls per request < 1",
        ),
    ],
)
def test_bad_workload_entries_are_rejected(tmp_path, entry: str, match: str) -> None:
    extra = tmp_path / "bad.yaml"
    extra.write_text("workloads:\n" + entry)
    with pytest.raises(CatalogError, match=match):
        load_catalog([extra])


@pytest.mark.parametrize(
    ("workloads", "match"),
    [
        ("  - {workload: masstree, load: {utilisation: 0.5}}\n", "unknown field"),
        ("  - {workload: masstree, load: {rps: 5, utilization: 0.5}}\n", "not both"),
        ("  - {workload: masstree, load: {rps: lots}}\n", "must be a number"),
        ("  - {workload: CG, thread: 2}\n", "unknown field"),
        ("  - {name: x}\n", "needs a 'workload'"),
    ],
)
def test_bad_scenario_files_are_clear_errors(tmp_path, workloads: str, match: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("machine: gold6130\nworkloads:\n" + workloads)
    with pytest.raises(CatalogError, match=match):
        get_scenario(str(f))


def test_malformed_catalog_entries_are_clear_errors(tmp_path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("machines:\n  m: [1, 2]\n")
    with pytest.raises(CatalogError, match="must be a mapping"):
        load_catalog([f])
    f.write_text(
        "workloads:\n  w: {source: x, threads: 1, cpi_base: 1, apki: 1, mlp: 1,"
        " footprint_mb: 1, mrc: {floor: 0.1, knees: [[1.0]]}}\n"
    )
    with pytest.raises(CatalogError, match="malformed"):
        load_catalog([f])
    f.write_text("workloads:\n  w: {source: x, threads: 1, cpu_base: 1}\n")
    with pytest.raises(CatalogError, match="unknown field"):
        load_catalog([f])


def test_unknown_names_are_clear_errors() -> None:
    with pytest.raises(CatalogError, match="unknown scenario"):
        get_scenario("no_such_scenario")
    with pytest.raises(CatalogError, match="unknown workload"):
        Scenario("x", "gold6130", (WorkloadInstance("a", "no_such_workload"),))
    with pytest.raises(CatalogError, match="unknown machine"):
        Scenario("x", "no_such_machine", ())
    with pytest.raises(ValueError, match="interval_s"):
        SimNode(interval_s=0)


def test_long_advances_do_not_drift() -> None:
    node = SimNode()
    for _ in range(10):
        node.advance(10.0)
    assert node.now() == pytest.approx(100.0, abs=1e-9)
    node.advance(0.05)
    assert node.now() == pytest.approx(100.05, abs=1e-9)
    with pytest.raises(ValueError, match="finite dt"):
        node.advance(-1.0)


def test_an_empty_scenario_is_a_quiet_node() -> None:
    node = SimNode(Scenario("empty", "gold6130", ()))
    node.advance(1.0)
    assert node.now() == 1.0
    assert node.observe().groups == {}
    node.create_group(GroupSpec("a"))
    node.advance(0.5)
    assert node.observe().groups["a"].instructions == 0.0
    assert set(node.steady_state()) == {"a"}


def test_concurrent_callers_are_serialised() -> None:
    import threading

    node = SimNode(seed=1)
    errors: list[BaseException] = []

    def worker(fn) -> None:
        try:
            for _ in range(50):
                fn()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [
        threading.Thread(target=worker, args=(lambda: node.advance(0.1),)),
        threading.Thread(target=worker, args=(node.observe,)),
        threading.Thread(
            target=worker,
            args=(
                lambda: node.apply(AllocationPlan.uniform({"ocean_cp": GroupAllocation(mb=50)})),
            ),
        ),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert node.now() == pytest.approx(5.0)


@pytest.mark.parametrize("seed", [-1, -(2**63)])
def test_a_refused_reset_leaves_the_node_as_it_was(seed: int) -> None:
    node = SimNode(seed=3)
    first = trajectory(node)
    with pytest.raises(ValueError, match="seed"):
        node.reset("copart_h_llc", seed=seed)
    assert node.scenario.name == "default"
    node.reset()
    assert trajectory(node) == first


def test_an_interrupted_advance_stops_at_a_whole_step_and_later_ones_do_not_start() -> None:
    import threading
    import time

    from agent.errors import Interrupted

    node = SimNode("default", seed=0)
    errors: list[Exception] = []

    def long_advance() -> None:
        try:
            node.advance(1e5)  # minutes of simulation: far longer than the test waits
        except Interrupted as exc:
            errors.append(exc)

    worker = threading.Thread(target=long_advance)
    worker.start()
    time.sleep(0.3)
    node.interrupt()
    worker.join(5.0)
    assert not worker.is_alive() and len(errors) == 1
    reached = node.now()
    assert 0 < reached < 1e5
    steps = reached / node.interval_s
    assert steps == pytest.approx(round(steps), abs=1e-6)  # a whole simulator step
    node.observe()  # the node still answers
    with pytest.raises(Interrupted, match="stopping"):
        node.advance(1.0)
    assert node.now() == reached

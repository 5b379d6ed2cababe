"""Controller specs and construction for a scenario; the CoPart variants and UCP-style keep
to their single resource; every built controller emits plans the node accepts."""

from __future__ import annotations

import pytest

from agent.sim import SimNode
from agent.types import GroupKind
from eval.controllers import ControllerSpec, build, needs_bare_node, split_specs
from models.controller import drive


def test_spec_parsing() -> None:
    s = ControllerSpec.parse("ubik[slack=0.01, period=5]")
    assert (s.name, dict(s.options), s.label) == (
        "ubik",
        {"slack": 0.01, "period": 5},
        "ubik[slack=0.01, period=5]",
    )
    assert [x.name for x in split_specs("eq, static[ways=3],ubik[slack=0,period=2]")] == [
        "eq",
        "static",
        "ubik",
    ]
    assert ControllerSpec("static", {"ways": 4}).text == "static[ways=4]"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("nope", "unknown controller 'nope'"),
        ("ubik[slack]", "bad option"),
        ("ubik[slack=1", "bad controller spec"),
    ],
)
def test_bad_specs_are_clear_errors(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ControllerSpec.parse(text)


def test_unknown_option_is_a_clear_error() -> None:
    node = SimNode("default", 0)
    with pytest.raises(ValueError, match="bad options for controller 'eq\\[foo=1\\]'"):
        build("eq[foo=1]", node, node)


@pytest.mark.parametrize(
    "text",
    [
        "unpartitioned",
        "eq",
        "copart",
        "copart_cat",
        "copart_mba",
        "static",
        "static[ways=3]",
        "ubik[slack=0.01]",
        "static_lc",
        "ucp",
    ],
)
def test_built_controllers_drive_a_node(text: str) -> None:
    node = SimNode("default", 1)
    before = node.now()
    ctl = build(text, node, node)
    assert node.now() == before  # calibration ran on a copy, not on the run's node
    records = drive(ctl, node, node, 40, 0.1)
    assert len(records) == 40
    caps = node.capabilities()
    for r in records:
        for g in r.allocation:
            a = r.allocation[g][0]
            assert a.l3_mask and a.l3_mask & ~caps.l3.cbm_mask == 0


def test_static_protects_the_lc_group_from_the_sweep() -> None:
    node = SimNode("default", 1)
    ctl = build("static", node, node)
    lc = [g for g, s in node.groups().items() if s.kind is GroupKind.LC]
    assert ctl.lc_group == lc[0] and 1 <= ctl.ways < node.capabilities().l3.num_ways


def test_copart_cat_only_never_throttles_bandwidth() -> None:
    node = SimNode("copart_h_bw", 0)
    top = node.capabilities().mba.max_bandwidth
    records = drive(build("copart_cat", node, node), node, node, 120, 0.1)
    assert any(r.decision.plan is not None for r in records[1:])
    assert {r.allocation[g][0].mb for r in records for g in r.allocation} == {top}


def test_copart_mba_only_keeps_the_equal_way_split() -> None:
    node = SimNode("copart_h_bw", 0)
    records = drive(build("copart_mba", node, node), node, node, 160, 0.1)
    late = records[80:]  # after profiling (4 apps x 3 runs x 6 intervals)
    ways = {
        tuple(sorted(bin(r.allocation[g][0].l3_mask).count("1") for g in r.allocation))
        for r in late
    }
    assert len(ways) == 1
    mbs = {r.allocation[g][0].mb for r in late for g in r.allocation}
    assert len(mbs) > 1  # bandwidth was traded


def test_ucp_moves_ways_by_utility() -> None:
    node = SimNode("copart_h_llc", 0)
    records = drive(build("ucp", node, node), node, node, 60, 0.1)
    counts = [
        sorted(bin(r.allocation[g][0].l3_mask).count("1") for g in r.allocation) for r in records
    ]
    assert counts[-1] != counts[0]  # Lookahead left the equal split
    assert all(sum(c) == node.capabilities().l3.num_ways for c in counts)


def test_time_sharing_needs_a_bare_node() -> None:
    spec = ControllerSpec.parse("coco")
    assert needs_bare_node(spec) and not needs_bare_node(ControllerSpec.parse("eq"))
    node = SimNode("more_lc_than_closids_epyc", 0)
    with pytest.raises(ValueError, match="without per-workload groups"):
        build(spec, node, node)


def test_merged_snapshots_sum_counters_and_weight_latency() -> None:
    from agent.types import GroupSample, LatencyStats, Snapshot
    from eval.controllers import merge_snapshots

    a = Snapshot(
        0.1,
        0.1,
        {
            "g": GroupSample(
                instructions=1e8,
                cycles=2e8,
                llc_misses=None,
                latency=LatencyStats(100, 1.0, 2.0, 3.0, 4.0),
            )
        },
    )
    b = Snapshot(
        0.2,
        0.1,
        {
            "g": GroupSample(
                instructions=3e8,
                cycles=4e8,
                llc_misses=5.0,
                latency=LatencyStats(300, 2.0, 3.0, 4.0, 5.0),
            )
        },
        vanished=frozenset({"x"}),
    )
    m = merge_snapshots([a, b])
    g = m.groups["g"]
    assert (m.timestamp, m.interval_s, m.vanished) == (0.2, pytest.approx(0.2), {"x"})
    assert (g.instructions, g.cycles, g.llc_misses) == (4e8, 6e8, None)  # None: not measured
    assert g.latency.count == 400 and g.latency.p95_ms == pytest.approx(2.75)


def test_decide_s_slows_any_controller_down() -> None:
    node = SimNode("default", 1)
    records = drive(build("ucp[period=1,decide_s=1]", node, node, 0.1), node, node, 60, 0.1)
    changed = [i for i, r in enumerate(records) if r.decision.plan is not None]
    assert changed and all(i % 10 == 9 for i in changed)  # decisions only every 10th interval
    with pytest.raises(ValueError, match="whole number"):
        build("eq[decide_s=0.25]", node, node, 0.1)

"""CoPart (EuroSys'19 sections 5.1-5.4) on the simulator: Algorithm 2's matching, fairness
versus EQ on CoPart's mix families, and re-adaptation after the case study's load step."""

from __future__ import annotations

import pytest

from agent.sim import SimNode
from agent.types import GroupKind, GroupSpec
from models.basic import EqualPartition
from models.controller import ControlContext, drive
from models.copart import CoPart, Fsm, Measure, Phase, stream_profile_sim
from models.oracle import evaluate_truth


def _run(scenario: str, intervals: int = 200, **kw) -> tuple[float, float, CoPart]:
    node = SimNode(scenario, noise=False)
    copart = CoPart(stream_profile_sim(node), period=4, profile_intervals=6, **kw)
    drive(copart, node, node, intervals)
    eq = SimNode(scenario, noise=False)
    drive(EqualPartition(), eq, eq, 2)
    return (
        evaluate_truth(node, node.allocation(), "fairness")[0],
        evaluate_truth(eq, eq.allocation(), "fairness")[0],
        copart,
    )


@pytest.mark.parametrize("scenario", ["copart_h_bw", "copart_m_bw"])
def test_lowers_unfairness_on_bandwidth_mixes(scenario):
    copart, eq, ctl = _run(scenario)
    assert [p for _, p, _ in ctl.history] == [Phase.PROFILE, Phase.EXPLORE, Phase.IDLE]
    assert copart < eq, f"CoPart unfairness {copart:.4f} not below EQ's {eq:.4f}"


@pytest.mark.xfail(
    strict=True,
    reason=(
        "simulator: stale lines outside a shrunk mask decay over tens of seconds when the "
        "co-runners holding those ways rarely miss (copart_m_llc: water_spatial at 2 ways "
        "runs at IPS 8.09e9 right after exploration and 7.86e9 after 80 s, while "
        "steady_state says 6.33e9, slowdown 1.33), so CoPart's FSMs see no loss when a "
        "way is taken and the ground-truth unfairness ends at EQ's (0.128 vs 0.127)"
    ),
)
@pytest.mark.parametrize("scenario", ["copart_h_llc", "copart_m_llc"])
def test_lowers_unfairness_on_llc_mixes(scenario):
    copart, eq, _ = _run(scenario)
    assert copart < eq


def test_readapts_after_memcached_load_step():
    node = SimNode("copart_memcached", noise=False, interval_s=0.5)
    ctl = CoPart(stream_profile_sim(node), period=2, profile_intervals=3)
    drive(ctl, node, node, 240, 0.5)  # 120 s; the load steps 75k -> 150k at 99.4 s
    before = [(t, p) for t, p, _ in ctl.history if t < 99.4]
    after = [(t, p, why) for t, p, why in ctl.history if t >= 99.4]
    assert before[-1][1] is Phase.IDLE, "CoPart should be idle before the step"
    assert after and after[0][1] is Phase.EXPLORE and after[0][0] < 99.4 + 5
    assert "memcached" in after[0][2]
    assert any(p is Phase.IDLE for _, p, _ in after[1:]), "never settled after the step"
    assert ctl.lc == {"memcached": ctl.lc["memcached"]}  # batch only: LC kept out of the FSMs
    assert "memcached" not in ctl.apps


def _copart_with(apps: dict[str, tuple[Fsm, Fsm, float, int, int]]) -> CoPart:
    """A CoPart set up on a gold6130 node with given FSM states, slowdowns and holdings."""
    node = SimNode("copart_h_bw", noise=False, auto_groups=False)
    for g in apps:
        node.create_group(GroupSpec(g, GroupKind.BATCH))
    ctl = CoPart({})
    caps = node.capabilities()
    ctl.start(ControlContext(caps, node.groups(), node.allocation()))
    for name, (llc, mba, slow, ways, units) in apps.items():
        a = ctl.apps[name]
        a.llc, a.mba, a.ways, a.units = llc, mba, ways, units
        a.ips_full, a.last = slow * 1e9, Measure(1e9, 1e8, 1e7)
    return ctl


def test_matching_favours_the_highest_slowdown_and_takes_from_the_lowest():
    D, S, M = Fsm.DEMAND, Fsm.SUPPLY, Fsm.MAINTAIN
    ctl = _copart_with(
        {
            "hi": (D, M, 1.8, 2, 2),  # demands LLC, slowest
            "mid": (D, M, 1.3, 2, 2),  # demands LLC too
            "give_a": (S, M, 1.0, 4, 3),  # supplies LLC, fastest
            "give_b": (S, M, 1.1, 3, 3),
        }
    )
    changes = ctl.next_state()
    assert changes["hi"] == "llc+" and changes["mid"] == "llc+"
    assert ctl.apps["give_a"].ways == 3 and ctl.apps["give_b"].ways == 2
    assert sum(a.ways for a in ctl.apps.values()) == 11


def test_oversubscribed_resource_goes_to_the_higher_slowdown():
    D, S, M = Fsm.DEMAND, Fsm.SUPPLY, Fsm.MAINTAIN
    ctl = _copart_with(
        {
            "hi": (M, D, 1.9, 3, 2),  # demands bandwidth
            "lo": (M, D, 1.2, 3, 2),
            "giver": (M, S, 1.0, 3, 4),  # one MBA producer
            "idle": (M, M, 1.0, 2, 2),
        }
    )
    changes = ctl.next_state()
    assert changes == {"hi": "mba+", "giver": "mba-"}
    assert ctl.apps["hi"].units == 3 and ctl.apps["lo"].units == 2
    assert sum(a.units for a in ctl.apps.values()) == 10


def test_needs_counters():
    node = SimNode("copart_h_bw", noise=False)
    ctl = CoPart({})
    ctl.start(ControlContext(node.capabilities(), node.groups(), node.allocation()))
    node.advance(0.1)
    snap = node.observe()
    blank = type(snap)(
        snap.timestamp,
        snap.interval_s,
        {g: type(s)() for g, s in snap.groups.items()},
    )
    ctx = ControlContext(node.capabilities(), node.groups(), node.allocation())
    for _ in range(ctl.profile_intervals - 1):
        ctl.decide(blank, ctx)
    with pytest.raises(ValueError, match="counters"):
        ctl.decide(blank, ctx)

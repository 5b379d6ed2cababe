"""The oracle: simulated nodes only, and at least as good as every other controller on
its own objective (ground truth of each controller's final allocation)."""

from __future__ import annotations

import pytest

from agent.sim import SimNode
from models.basic import EqualPartition, Unpartitioned
from models.controller import drive
from models.copart import CoPart, stream_profile_sim
from models.oracle import Oracle, evaluate_truth
from models.static import BestStatic, StaticController, calibrate
from models.ubik import StaticLC, Ubik


def _controllers(scenario: str, node: SimNode) -> list:
    out = [Unpartitioned(), EqualPartition(), BestStatic(max_evals=150)]
    if any(g.kind == "lc" for g in node.groups().values()):
        lc = next(g for g, s in node.groups().items() if s.kind == "lc")
        probe = SimNode(scenario, noise=False)
        out.append(StaticController.from_sweep(calibrate(probe, probe, lc, measure_s=1.0)))
    if node.capabilities().mba is not None:
        out.append(CoPart(stream_profile_sim(node)))
    # Ubik and its StaticLC reference (CoCo time-shares tier groups it creates itself, on
    # nodes without per-service groups, so its allocations are not on this node's terms).
    out += [Ubik(), StaticLC()]
    return out


@pytest.mark.parametrize(
    ("scenario", "objective"),
    [
        ("copart_h_bw", "fairness"),
        ("copart_memcached", None),  # SLO-first with memcached present
        ("catbench_kv_big_tensorflow", None),
    ],
)
def test_oracle_is_at_least_as_good_as_every_controller(scenario, objective):
    node = SimNode(scenario, noise=False)
    oracle = Oracle(node, objective, max_evals=300)
    drive(oracle, node, node, 1)
    best = evaluate_truth(node, node.allocation(), objective)[0]
    assert best == pytest.approx(oracle.result.score)
    for ctl in _controllers(scenario, SimNode(scenario, noise=False)):
        sim = SimNode(scenario, noise=False)
        if isinstance(ctl, BestStatic):
            ctl.objective = objective
            ctl.fit(sim)
        drive(ctl, sim, sim, 150)
        theirs = evaluate_truth(sim, sim.allocation(), objective)[0]
        assert best <= theirs + 1e-9, f"{ctl.name} scored {theirs:.5g} < oracle {best:.5g}"


def test_oracle_searches_again_when_the_load_steps():
    node = SimNode("copart_memcached", noise=False, interval_s=0.5)
    oracle = Oracle(node, max_evals=60)
    node.advance(95.0)
    drive(oracle, node, node, 12, 0.5)  # crosses the 75k -> 150k step at 99.4 s
    assert oracle.searches == 2


def test_oracle_refuses_a_real_node():
    class NotSim:
        pass

    with pytest.raises(TypeError, match="simulated node"):
        Oracle(NotSim())
